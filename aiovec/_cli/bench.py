"""``python -m aiovec bench MODULE:FACTORY`` (or a registry id): which backend suits *your* env?

Theory of operation
-------------------
1. **Load** and 2. **probe** the factory: see ``_cli/factory.py``.
3. **Plan** one configuration per backend x ``num_envs`` (x ``num_workers`` for
   ``process``), each twice: lock-step ``step()``, and partial stepping through
   `aiovec.Collector` (``_cli/partial.py``; ``--no-collector`` leaves it out).
   The tie rule ranks lock-step as simpler, so the collector is recommended only
   where it is faster beyond the noise.  A ``process`` configuration with one
   worker per usable CPU, which the default ``cpus="auto"`` pins one per CPU, is
   measured with ``backend_options={"cpus": None}`` too (the OS places the
   workers: on a machine shared with other work pinning can lose); the default
   placement ranks as simpler.  Where the env's registry id has a vector
   entry point (gymnasium's own vector env, e.g. CartPole's, which steps every
   env in one numpy call), it is measured at each size too, and named with its
   figure: it is gymnasium's, not aiovec's, so it is never the recommendation.
   A backend that cannot run here
   (``thread`` for async envs, a backend not in this release, a missing optional
   dependency) is listed as skipped, with the reason.
4. **Measure** each configuration ``--repeats`` times (3 by default),
   *interleaved*: every configuration once, then every one again, so that a
   slow spell of the machine hits all of them rather than one.  A repeat runs
   through the await API on a fresh event loop: build, ``reset(seed=0)``, one
   untimed step, then timed steps (seeded random actions) for its share of
   ``--seconds`` (at least 3 steps), sampling the resident memory of this
   process and its workers.  A configuration that fails is a row saying why
   (its later repeats are skipped); the others still run.
5. **Report**: a table (the median rate over the repeats and its spread), the
   recommended configuration with the line of code that builds it, the best
   backend for each ``num_envs`` and, with ``--plot``, env-steps per second
   against ``num_envs``, one line per backend.

The tie rule (`choose`): the fastest configuration is the one with the highest
median; every configuration whose range of rates over the repeats overlaps the
fastest one's is *within the noise* of it, and the simplest of those (`simplicity`:
inline, thread, process, ray; then fewer workers; then the default placement;
then fewer envs) is the one
recommended, saying so.  Two runs on the same env thus recommend the same
configuration, or say that the two are tied.

The blocking-env warning (`looks_blocking`): a synchronous env on the inline
backend runs in the loop's own thread, so its calls are timed against this
thread's CPU time too.  When most of an inline step's wall time is spent off the
CPU (``BLOCKING_IDLE``) and that is at least ``BLOCKING_WAIT`` per env-step, the
env waits in blocking calls (a socket, HTTP, ``time.sleep``): on inline it stalls
every other env, and the report says to use ``backend="thread"``.  A CPU-bound env
is on the CPU, so it is never flagged; a machine so busy that this thread waits
for a core half the time could flag one (the warning says what it measured).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import os
import statistics
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiovec
from aiovec._cli.args import int_list, json_object, positive_float, positive_int
from aiovec._cli.factory import Factory, FactoryError, load_factory, print_error, probe
from aiovec._cli.memory import PeakMemory
from aiovec._cli.partial import collector_shape, measure_collector
from aiovec._cli.report import Progress, StepTimes, format_table, large_n_advice, short, timed
from aiovec._core.validate import BACKENDS as ALL_BACKENDS
from aiovec._core.validate import usable_cpus
from aiovec.backends import load_backend

__all__ = (
    "ENTRY_POINT",
    "Choice",
    "Config",
    "Result",
    "add_parser",
    "choose",
    "looks_blocking",
    "measure",
    "merge",
    "plan",
    "plot",
    "recommend",
    "render",
    "run",
    "simplicity",
    "within_noise",
)

MIN_STEPS = 3
MIN_REPEATS = 3
BLOCKING_IDLE = 0.5  # share of an inline step's wall time off the CPU ...
BLOCKING_WAIT = 0.5e-3  # ... and at least this many seconds of it per env-step
SIMPLER = ("inline", "thread", "process", "ray")  # simplest first
ACTION_POOL = 16  # action batches sampled up front and replayed
USAGE_ERROR = 2
ENTRY_POINT = "vector entry point"  # Config.backend of gymnasium's own vector env


@dataclass(frozen=True)
class Config:
    """One configuration to measure."""

    backend: str
    num_envs: int
    num_workers: int | None = None  # None: the backend's default
    collector: bool = False  # partial stepping through aiovec.Collector, not step()
    unpinned: bool = False  # process: backend_options={"cpus": None} (the OS places workers)

    @property
    def kind(self) -> str:
        """The backend and worker count, e.g. ``process, 2 workers``; ``+ Collector``."""
        kind = self.backend
        if self.num_workers is not None:
            kind += f", {self.num_workers} worker{'s' * (self.num_workers > 1)}"
        if self.unpinned:
            kind += ", cpus=None"
        return kind + (" + Collector" if self.collector else "")

    @property
    def backend_options(self) -> dict[str, Any] | None:
        """The ``backend_options`` this configuration passes (``None``: none)."""
        return {"cpus": None} if self.unpinned else None

    def code(self, factory: str) -> str:
        """The line that builds this configuration (two with the collector)."""
        workers = "" if self.num_workers is None else f", num_workers={self.num_workers}"
        if self.unpinned:
            workers += ', backend_options={"cpus": None}'
        line = (
            f'aiovec.AsyncioVectorEnv([{factory}] * {self.num_envs}, backend="{self.backend}"'
            f"{workers})"
        )
        if not self.collector:
            return line
        length, size = collector_shape(self.num_envs)
        return (
            f"venv = {line}\n    collector = aiovec.Collector(venv, policy, "
            f"segment_length={length}, batch_size={size})  # docs/collector.md"
        )


@dataclass(frozen=True)
class Result:
    """What one configuration measured over its repeats, or why it failed."""

    config: Config
    repeats: tuple[StepTimes, ...] = ()
    peak_rss: int | None = None
    error: BaseException | None = None

    @property
    def rates(self) -> tuple[float, ...]:
        """Env-steps per second of each repeat (none if it failed)."""
        return () if self.error is not None else tuple(t.rate for t in self.repeats)

    @property
    def rate(self) -> float:
        """The median of `rates` (0 if it failed)."""
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def spread(self) -> float:
        """Half the range of `rates`, as a fraction of the median."""
        rates = self.rates
        return (max(rates) - min(rates)) / 2 / self.rate if rates and self.rate else 0.0

    @property
    def figure(self) -> str:
        """``12,345 env-steps/s +/-3%``: the median rate and its spread."""
        return f"{self.rate:,.0f} env-steps/s +/-{self.spread:.0%}"

    @property
    def times(self) -> StepTimes | None:
        """Every repeat's step times together (``None`` if it failed)."""
        if not self.rates:
            return None
        seconds = tuple(t for run in self.repeats for t in run.seconds)
        return StepTimes(self.config.num_envs, seconds)


def merge(parts: Sequence[Result]) -> Result:
    """The repeats of one configuration as one result (failed if any repeat failed)."""
    errors = [part.error for part in parts if part.error is not None]
    peaks = [part.peak_rss for part in parts if part.peak_rss is not None]
    return Result(
        parts[0].config,
        tuple(run for part in parts for run in part.repeats),
        max(peaks, default=None),
        errors[0] if errors else None,
    )


BACKENDS = tuple(name for name in ALL_BACKENDS if name != "remote")  # its envs: a server's

# --------------------------------------------------------------------------- plan and measure


def plan(
    kind: str,
    backends: Sequence[str],
    sizes: Sequence[int],
    workers: Sequence[int],
    *,
    partial: bool = False,
    cores: int | None = None,
    entry_point: bool = False,
) -> tuple[list[Config], list[str]]:
    """Configurations to measure, and one line per backend skipped (with the reason).

    ``partial``: each configuration also through a `aiovec.Collector`;
    ``entry_point``: gymnasium's own vector env too, at each size.  A process
    configuration with one worker per usable CPU (``cores``, default: this
    machine's), which the default ``cpus="auto"`` pins one per CPU, is measured
    with ``cpus=None`` too (the OS places the workers): on a machine shared with
    other work, pinning can lose.
    """
    if cores is None:
        cores = len(usable_cpus())
    configs: list[Config] = []
    skipped: list[str] = []
    for backend in backends:
        reason = _unavailable(backend, kind)
        if reason:
            skipped.append(f"{backend}: {reason}")
            continue
        for n in sizes:
            if backend == "process":
                for w in workers:
                    if w <= n:
                        configs.append(Config(backend, n, w))
                        if w == cores and hasattr(os, "sched_setaffinity"):  # "auto" pins
                            configs.append(Config(backend, n, w, unpinned=True))
            else:
                configs.append(Config(backend, n))
    if partial:
        configs += [dataclasses.replace(c, collector=True) for c in configs]
    if entry_point:
        configs += [Config(ENTRY_POINT, n) for n in sizes]
    return configs, skipped


def _unavailable(backend: str, kind: str) -> str:
    if backend == "thread" and kind == "async":
        return "runs synchronous envs only, and this factory makes async envs"
    try:
        load_backend(backend)
    except (NotImplementedError, ImportError) as exc:
        return str(exc).split(";")[0]
    if backend == "ray" and not os.environ.get("RAY_ADDRESS"):
        return "not measured without a Ray cluster to join (set RAY_ADDRESS; see docs/ray.md)"
    return ""


def measure(factory: Factory, config: Config, seconds: float) -> Result:
    """Measure one repeat of one configuration; a failure becomes a result carrying the error."""
    memory = PeakMemory()
    try:
        times = asyncio.run(_measure(factory, config, seconds, memory))
    except Exception as exc:
        return Result(config, error=exc)
    return Result(config, (times,), memory.peak)


async def _measure(
    factory: Factory, config: Config, seconds: float, memory: PeakMemory
) -> StepTimes:
    if config.backend == ENTRY_POINT:
        return await _measure_entry_point(factory, config.num_envs, seconds, memory)
    venv: aiovec.AsyncioVectorEnv[Any, Any] = aiovec.AsyncioVectorEnv(
        [factory.make] * config.num_envs,
        backend=config.backend,
        num_workers=config.num_workers,
        backend_options=config.backend_options,
    )
    async with venv:
        venv.action_space.seed(0)
        actions = [venv.action_space.sample() for _ in range(ACTION_POOL)]
        if config.collector:
            return await measure_collector(venv, actions, seconds, memory, MIN_STEPS)
        await venv.reset(seed=0)
        await venv.step(actions[0])  # warm-up: first-call costs are not the steady state
        return await timed(
            lambda k: venv.step(actions[k % ACTION_POOL]), venv.num_envs, seconds, memory, MIN_STEPS
        )


async def _measure_entry_point(
    factory: Factory, num_envs: int, seconds: float, memory: PeakMemory
) -> StepTimes:
    """Gymnasium's own vector env of the factory's id, timed as a configuration is."""
    assert factory.entry_point is not None
    kwargs = factory.kwargs if factory.args else {}  # the id's own kwargs, not a factory's
    envs = aiovec.make(factory.entry_point, num_envs, "vector_entry_point", **kwargs)
    try:
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(ACTION_POOL)]
        envs.reset(seed=0)
        envs.step(actions[0])

        async def step(k: int) -> None:
            envs.step(actions[k % ACTION_POOL])

        return await timed(step, num_envs, seconds, memory, MIN_STEPS)
    finally:
        envs.close()


# --------------------------------------------------------------------------- report


def within_noise(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two configurations' rates over their repeats overlap (neither is surely faster)."""
    return min(a) <= max(b) and min(b) <= max(a)


def simplicity(config: Config) -> tuple[int, int, int, int, int]:
    """A sort key, simplest first: lock-step, backend (`SIMPLER`), workers, placement, envs.

    Fewer workers, the default placement and fewer envs are simpler.  A collector
    configuration is recommended only where it is faster beyond the noise, and so is
    ``cpus=None``.
    """
    rank = SIMPLER.index(config.backend) if config.backend in SIMPLER else len(SIMPLER)
    workers = config.num_workers or 0
    return int(config.collector), rank, workers, int(config.unpinned), config.num_envs


@dataclass(frozen=True)
class Choice:
    """The tie rule's answer: what to recommend, the fastest, and the others tied with it."""

    pick: Result
    fastest: Result
    tied: tuple[Result, ...]  # within the noise of the fastest, other than ``pick``


def choose(results: Sequence[Result]) -> Choice | None:
    """The simplest configuration within the noise of the fastest (highest median); see above."""
    measured = [r for r in results if r.rates and r.config.backend != ENTRY_POINT]
    if not measured:
        return None
    fastest = max(measured, key=lambda r: r.rate)
    tied = [r for r in measured if within_noise(r.rates, fastest.rates)]
    pick = min(tied, key=lambda r: simplicity(r.config))
    return Choice(pick, fastest, tuple(r for r in tied if r is not pick))


def looks_blocking(wall: float, cpu: float, env_steps: int) -> bool:
    """Whether inline steps of a sync env spent their time waiting in blocking calls.

    Args:
        wall: Wall-clock seconds of the timed steps.
        cpu: CPU seconds of the loop's thread over those steps.
        env_steps: Env-steps they made (steps times ``num_envs``).
    """
    idle = wall - cpu
    return idle > BLOCKING_IDLE * wall and idle >= BLOCKING_WAIT * env_steps


def _blocking_warning(results: Sequence[Result], factory: Factory) -> str:
    for result in results:
        runs = [t for t in result.repeats if t.cpu_seconds is not None]
        if result.config.backend != "inline" or not result.rates or not runs:
            continue
        wall = sum(sum(t.seconds) for t in runs)
        cpu = sum(t.cpu_seconds or 0.0 for t in runs)
        env_steps = sum(t.num_envs * t.steps for t in runs)
        if looks_blocking(wall, cpu, env_steps):
            return (
                f"Warning: {factory.name} looks like a blocking env. On inline with "
                f"{result.config.num_envs} envs, {1 - cpu / wall:.0%} of the step time was spent "
                f"off the CPU ({(wall - cpu) / env_steps * 1e3:.2f} ms per env-step): a "
                "synchronous env that waits (a socket, HTTP, time.sleep) blocks the event "
                'loop, and every other env with it. Use backend="thread", or write the env '
                "as an aiovec.AsyncEnv."
            )
    return ""


def render(results: Sequence[Result], skipped: Sequence[str], factory: Factory) -> str:
    """The table, the skipped backends, the recommendation, any warning and advice."""
    choice = choose(results)
    rows = [_row(result, choice) for result in results]
    header = [
        "backend", "num_envs", "env-steps/s", "spread", "step p50", "step p99", "peak RSS", ""
    ]  # fmt: skip
    repeats = max((len(r.repeats) for r in results), default=0)
    parts = [
        f"{factory.target}: env-steps per second through the await API "
        f"(median of {repeats} interleaved repeats, +/- half their range)",
        "",
        format_table(header, rows),
    ]
    if skipped:
        parts += ["", "Skipped: " + "; ".join(skipped) + "."]
    parts += ["", recommend(results, factory)]
    notes = [
        _blocking_warning(results, factory) if factory.kind == "sync" else "",
        _entry_point_note(results, factory),
        large_n_advice(max((r.config.num_envs for r in results), default=0)),
    ]
    parts += [line for note in notes if note for line in ("", note)]
    return "\n".join(parts)


def _entry_point_note(results: Sequence[Result], factory: Factory) -> str:
    """What gymnasium's own vector env of the id made, and how to get it."""
    entries = [r for r in results if r.config.backend == ENTRY_POINT]
    if not entries:
        return ""
    best = max(entries, key=lambda r: r.rate)
    head = f"{factory.entry_point} has a vector entry point: gymnasium's own vector env of it"
    if not best.rates:
        return f"{head} failed here ({_why(best)})."
    choice = choose(results)
    than = f", {best.rate / choice.pick.rate:.1f}x the recommended" if choice else ""
    return (
        f"{head} made {best.rate:,.0f} env-steps/s with {best.config.num_envs} envs{than}. "
        f'aiovec.make("{factory.entry_point}", {best.config.num_envs}, '
        'vectorization_mode="vector_entry_point") returns it, as gymnasium.make_vec does: '
        "it steps every env in one call, without aiovec's backends, timeouts, restarts or "
        "collectors, and without what your factory adds to the env."
    )


def _row(result: Result, choice: Choice | None) -> list[str]:
    config = result.config
    times = result.times
    if times is None:
        why = f"failed: {_why(result)}"
        return [config.kind, str(config.num_envs), "-", "-", "-", "-", "-", why]
    rss = "n/a" if result.peak_rss is None else f"{result.peak_rss / 2**20:,.0f} MiB"
    note = ""
    if choice is not None and result is choice.pick:
        note = "<- recommended"
    elif choice is not None and result is choice.fastest:
        note = "fastest, tied"
    return [
        config.kind,
        str(config.num_envs),
        f"{result.rate:,.0f}",
        f"+/-{result.spread:.0%}",
        f"{times.percentile_ms(50):.2f} ms",
        f"{times.percentile_ms(99):.2f} ms",
        rss,
        note,
    ]


def recommend(results: Sequence[Result], factory: Factory) -> str:
    """The recommended configuration, its code, and the best backend for each ``num_envs``."""
    choice = choose(results)
    if choice is None:
        return "Every configuration failed: see the reasons above (--traceback shows where)."
    pick = choice.pick
    lines = [
        f"Recommended: {pick.config.kind} with {pick.config.num_envs} envs, {pick.figure}:",
        f"    {pick.config.code(factory.expression)}",
    ]
    if pick is not choice.fastest:
        fastest = choice.fastest
        lines.append(
            f"  Tied: the fastest, {fastest.config.kind} with {fastest.config.num_envs} envs "
            f"({fastest.figure}), is within the noise of it (their repeats overlap), so the "
            "simpler configuration is recommended."
        )
    lines += [
        "",
        "Best backend for each num_envs (more envs per step: more throughput, and a "
        "bigger batch for your learner):",
    ]
    for n in sorted({r.config.num_envs for r in results}):
        per_size = choose([r for r in results if r.config.num_envs == n])
        if per_size is None:
            continue
        top = per_size.pick
        inline = next((r for r in results if r.config == Config("inline", n) and r.rates), None)
        versus = ""
        if per_size.tied:
            others = ", ".join(r.config.kind for r in per_size.tied)
            versus = f" (tied with {others}: the simplest is shown)"
        elif inline is not None and inline is not top:
            versus = f" ({top.rate / inline.rate:.1f}x inline)"
        lines.append(f"  {n:>6} envs: {top.config.kind}, {top.figure}{versus}")
    return "\n".join(lines)


def plot(results: Sequence[Result], path: Path, title: str) -> None:
    """Env-steps per second against ``num_envs``, one line per backend (needs matplotlib)."""
    from matplotlib.figure import Figure  # noqa: PLC0415  (optional extra "plot")

    figure = Figure(figsize=(6.4, 4.0), layout="constrained")
    axes = figure.add_subplot()
    for kind in dict.fromkeys(r.config.kind for r in results):
        points = [(r.config.num_envs, r.rate) for r in results if r.config.kind == kind and r.times]
        if points:
            xs, ys = zip(*points, strict=True)
            axes.plot(xs, ys, marker="o", label=kind)
    sizes = sorted({r.config.num_envs for r in results})
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes, labels=[str(n) for n in sizes])
    axes.set_ylim(bottom=0)
    axes.yaxis.set_major_formatter("{x:,.0f}")
    axes.set_xlabel("num_envs")
    axes.set_ylabel("env-steps per second")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)


def _why(result: Result) -> str:
    assert result.error is not None
    return short(f"{type(result.error).__name__}: {result.error}")


# --------------------------------------------------------------------------- the command


def _default_workers() -> tuple[int, ...]:
    cores = len(usable_cpus())
    powers = {2**k for k in range(cores.bit_length()) if 2**k <= cores}
    return tuple(sorted(powers | {cores}))


def add_parser(commands: Any) -> None:
    """Register the ``bench`` command on an ``argparse`` sub-parser collection."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "bench",
        help="measure your env factory on every backend and recommend one",
        description=(
            "Measure an env factory on every available backend and several sizes, print "
            "env-steps/s, step latency and memory, and recommend a configuration: the fastest, "
            "or the simplest of those within the noise of it."
        ),
    )
    parser.add_argument(
        "target",
        metavar="MODULE:FACTORY",
        help="e.g. mypackage.envs:make_env, envs.py:make_env, or a registry id: CartPole-v1",
    )
    parser.add_argument(
        "--num-envs",
        type=int_list,
        default=(8, 32, 128),
        help="comma-separated env counts (default: 8,32,128)",
    )
    parser.add_argument(
        "--backends",
        type=_backend_list,
        default=BACKENDS,
        help=f"comma-separated backends (default: all of {','.join(BACKENDS)})",
    )
    parser.add_argument(
        "--workers",
        type=int_list,
        default=_default_workers(),
        help="comma-separated worker counts for backend=process (default: powers of 2 up to "
        "the core count)",
    )
    parser.add_argument(
        "--seconds",
        type=positive_float,
        default=1.0,
        help="seconds of timed steps per configuration, shared by its repeats (default: 1)",
    )
    parser.add_argument(
        "--repeats",
        type=_repeats,
        default=MIN_REPEATS,
        help=f"interleaved repeats per configuration (default and least: {MIN_REPEATS})",
    )
    parser.add_argument(
        "--env-kwargs",
        type=json_object,
        default={},
        metavar="JSON",
        help="keyword arguments for the factory, a JSON object: e.g. '{\"size\": 7}'",
    )
    parser.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="draw env-steps/s vs num_envs"
    )
    parser.add_argument(
        "--no-collector",
        action="store_true",
        help="measure lock-step step() only, not partial stepping through aiovec.Collector",
    )
    parser.add_argument(
        "--traceback", action="store_true", help="show the traceback of a failing factory or env"
    )
    parser.set_defaults(run=run)


def _repeats(text: str) -> int:
    value = positive_int(text)
    if value < MIN_REPEATS:
        raise argparse.ArgumentTypeError(
            f"expected at least {MIN_REPEATS} (a spread and the tie rule need them), got {value}"
        )
    return value


def _backend_list(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated backends among {', '.join(BACKENDS)}, got {text!r}"
        )
    return names


def run(args: argparse.Namespace) -> int:
    """Run the benchmark from parsed arguments; the exit status."""
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        print(
            'aiovec bench: --plot needs matplotlib: pip install "aiovec[plot]" (or drop --plot).',
            file=sys.stderr,
        )
        return USAGE_ERROR
    try:
        factory = probe(load_factory(args.target, args.env_kwargs))
    except FactoryError as exc:
        print_error(exc, args.target, show_traceback=args.traceback)
        return USAGE_ERROR
    configs, skipped = plan(
        factory.kind,
        args.backends,
        args.num_envs,
        args.workers,
        partial=not args.no_collector,
        entry_point=factory.entry_point is not None,
    )
    print(
        f"Measuring {args.target} ({factory.kind} envs): {len(configs)} configurations x "
        f"{args.repeats} interleaved repeats, about {args.seconds:g} s of steps each.",
        file=sys.stderr,
    )
    results = _measure_all(
        factory, configs, args.seconds, args.repeats, show_traceback=args.traceback
    )
    print(render(results, skipped, factory))
    if args.plot is not None and any(r.times for r in results):
        plot(results, args.plot, f"aiovec bench {args.target}")
        print(f"\nPlot written to {args.plot}")
    return 0 if any(r.times for r in results) else 1


def _measure_all(
    factory: Factory,
    configs: Sequence[Config],
    seconds: float,
    repeats: int,
    *,
    show_traceback: bool,
) -> list[Result]:
    """Every configuration once, then again, ``repeats`` times; merged per configuration."""
    progress = Progress(len(configs) * repeats)
    parts: dict[Config, list[Result]] = {config: [] for config in configs}

    def merged() -> list[Result]:
        return [merge(runs) for runs in parts.values() if runs]

    try:
        for repeat in range(repeats):
            for config in configs:
                runs = parts[config]
                if runs and runs[-1].error is not None:  # failed once: not measured again
                    progress.advance()
                    continue
                progress.phase(f"{config.kind}, {config.num_envs} envs ({repeat + 1}/{repeats})")
                runs.append(measure(factory, config, seconds / repeats))
                progress.advance()
                error = runs[-1].error
                if show_traceback and error is not None:
                    progress.close()
                    traceback.print_exception(error, file=sys.stderr)
    except KeyboardInterrupt:
        progress.close()
        if any(parts.values()):
            print(render(merged(), [], factory))
        raise
    finally:
        progress.close()
    return merged()
