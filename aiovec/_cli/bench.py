"""``python -m aiovec bench MODULE:FACTORY``: which backend suits *your* env?

Theory of operation
-------------------
1. **Load** the factory: ``package.module:make_env`` is imported (the current
   directory is on the path, as for ``python -m``); ``path/to/file.py:make_env``
   is loaded from that file, its folder put first on ``sys.path`` (as when the
   file is run as a script) and the module registered with cloudpickle to
   travel *by value*, so worker processes need not be able to import it.
2. **Probe**: the factory is called once, here, and what it returns is checked
   to be an env (sync or async) and closed.  Anything wrong so far is one
   paragraph (`FactoryError`) naming the factory, what went wrong and
   what a factory must be; ``--traceback`` adds the traceback.
3. **Plan** one configuration per backend x ``num_envs`` (x ``num_workers`` for
   ``process``).  A backend that cannot run here (``thread`` for async envs, a
   backend not in this release, a missing optional dependency) is listed as
   skipped, with the reason.
4. **Measure** each configuration through the await API, on a fresh event
   loop: build, ``reset(seed=0)``, one untimed step, then timed steps (seeded
   random actions) for ``--seconds`` (at least 3 steps), sampling the resident
   memory of this process and its workers.  A configuration that fails is a
   row saying why; the others still run.
5. **Report**: a table, the fastest configuration with the line of code that
   builds it, the best backend for each ``num_envs`` and, with ``--plot``,
   env-steps per second against ``num_envs``, one line per backend.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import inspect
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

import aiovec
from aiovec._cli.args import int_list, positive_float
from aiovec._cli.memory import PeakMemory
from aiovec._cli.report import Progress, StepTimes, format_table
from aiovec._core.validate import BACKENDS, usable_cpus
from aiovec.backends import load_backend
from aiovec.backends._base import check_env

__all__ = (
    "Config",
    "Factory",
    "FactoryError",
    "Result",
    "add_parser",
    "load_factory",
    "measure",
    "plan",
    "plot",
    "probe",
    "recommend",
    "render",
    "run",
)

MIN_STEPS = 3
ACTION_POOL = 16  # action batches sampled up front and replayed
USAGE_ERROR = 2
_FACTORY_HELP = (
    "A factory is a callable that takes no arguments and returns a new env each time it "
    "is called: a gymnasium.Env or an aiovec.AsyncEnv (an env class works too)."
)


class FactoryError(Exception):
    """The factory cannot be loaded, called, or does not make an env (one paragraph)."""


@dataclass(frozen=True)
class Factory:
    """A loaded env factory and where it came from."""

    target: str
    name: str
    make: Callable[[], Any]


@dataclass(frozen=True)
class Config:
    """One configuration to measure."""

    backend: str
    num_envs: int
    num_workers: int | None = None  # None: the backend's default

    @property
    def kind(self) -> str:
        """The backend and worker count, e.g. ``process, 2 workers``."""
        if self.num_workers is None:
            return self.backend
        return f"{self.backend}, {self.num_workers} worker{'s' * (self.num_workers > 1)}"

    def code(self, factory: str) -> str:
        """The line that builds this configuration."""
        workers = "" if self.num_workers is None else f", num_workers={self.num_workers}"
        return (
            f'aiovec.AsyncioVectorEnv([{factory}] * {self.num_envs}, backend="{self.backend}"'
            f"{workers})"
        )


@dataclass(frozen=True)
class Result:
    """What one configuration measured, or why it failed."""

    config: Config
    times: StepTimes | None = None
    peak_rss: int | None = None
    error: BaseException | None = None


# --------------------------------------------------------------------------- load and probe


def load_factory(target: str) -> Factory:
    """Import ``MODULE:FACTORY`` or load ``path/to/file.py:FACTORY``.

    Raises:
        FactoryError: The target is malformed, the module or file cannot be
            loaded, or it has no such callable.
    """
    source, sep, name = target.rpartition(":")
    if not sep or not source or not name:
        raise FactoryError(
            f"expected MODULE:FACTORY or path/to/file.py:FACTORY, got {target!r} "
            "(e.g. mypackage.envs:make_env or envs.py:make_env)."
        )
    is_file = source.endswith(".py") or "/" in source or os.sep in source
    module = _load_file(Path(source)) if is_file else _import(source)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            names = sorted(k for k, v in vars(module).items() if callable(v) and k[0] != "_")
            raise FactoryError(
                f"{source} has no attribute {name!r}; it defines these callables: "
                f"{', '.join(names) or 'none'}."
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(f"{target} is not callable (it is {_short(repr(obj))}). {_FACTORY_HELP}")
    return Factory(target, name, obj)


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise FactoryError(
                f"no module named {module_name!r} (searched the current directory and the "
                "installed packages; for a file, write path/to/file.py:FACTORY)."
            ) from exc
        raise FactoryError(_failed(f"importing {module_name}", exc)) from exc
    except Exception as exc:
        raise FactoryError(_failed(f"importing {module_name}", exc)) from exc


def _load_file(path: Path) -> Any:
    if not path.is_file():
        raise FactoryError(f"no such file: {path}.")
    module_name = f"_aiovec_bench_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise FactoryError(f"cannot load {path} as a Python module (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))  # its sibling modules import, as in a script
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[module_name]
        if not isinstance(exc, Exception):
            raise
        raise FactoryError(_failed(f"running {path}", exc)) from exc
    cloudpickle.register_pickle_by_value(module)  # workers cannot import it by name
    return module


def probe(factory: Factory) -> str:
    """Call the factory once and check what it returns; ``"sync"`` or ``"async"``.

    Raises:
        FactoryError: The call raised or returned something that is not an env.
    """
    try:
        env = factory.make()
    except Exception as exc:
        hint = ""
        if isinstance(exc, TypeError) and "argument" in str(exc):
            hint = " It must take no arguments: bind them in a function of your own."
        raise FactoryError(
            _failed(f"calling {factory.name}()", exc) + hint + " " + _FACTORY_HELP
        ) from exc
    try:
        check_env(0, env)  # the env protocol's members, as AsyncioVectorEnv checks them
    except TypeError as exc:
        what = str(exc).replace("env_fns[0]()", f"{factory.name}()")
        raise FactoryError(f"{what}. {_FACTORY_HELP}") from None
    kind = "async" if inspect.iscoroutinefunction(env.step) else "sync"
    _close(env)
    return kind


def _close(env: Any) -> None:
    """Close a probe env, best effort (its close is not what is measured)."""
    try:
        result = env.close()
        if inspect.isawaitable(result):
            asyncio.run(_awaited(result))
    except Exception:
        pass  # a probe env that fails to close is not what the user asked about


async def _awaited(awaitable: Any) -> None:
    await awaitable


# --------------------------------------------------------------------------- plan and measure


def plan(
    kind: str,
    backends: Sequence[str],
    sizes: Sequence[int],
    workers: Sequence[int],
) -> tuple[list[Config], list[str]]:
    """Configurations to measure, and one line per backend skipped (with the reason)."""
    configs: list[Config] = []
    skipped: list[str] = []
    for backend in backends:
        reason = _unavailable(backend, kind)
        if reason:
            skipped.append(f"{backend}: {reason}")
            continue
        for n in sizes:
            if backend == "process":
                configs += [Config(backend, n, w) for w in workers if w <= n]
            else:
                configs.append(Config(backend, n))
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
    """Measure one configuration; a failure becomes a result carrying the error."""
    memory = PeakMemory()
    try:
        times = asyncio.run(_measure(factory, config, seconds, memory))
    except Exception as exc:
        return Result(config, error=exc)
    return Result(config, times, memory.peak)


async def _measure(
    factory: Factory, config: Config, seconds: float, memory: PeakMemory
) -> StepTimes:
    venv: aiovec.AsyncioVectorEnv[Any, Any] = aiovec.AsyncioVectorEnv(
        [factory.make] * config.num_envs, backend=config.backend, num_workers=config.num_workers
    )
    async with venv:
        venv.action_space.seed(0)
        actions = [venv.action_space.sample() for _ in range(ACTION_POOL)]
        await venv.reset(seed=0)
        await venv.step(actions[0])  # warm-up: first-call costs are not the steady state
        memory.sample()
        times: list[float] = []
        deadline = time.perf_counter() + seconds
        while len(times) < MIN_STEPS or time.perf_counter() < deadline:
            start = time.perf_counter()
            await venv.step(actions[len(times) % ACTION_POOL])
            times.append(time.perf_counter() - start)
            memory.maybe_sample()
        memory.sample()
        return StepTimes(config.num_envs, tuple(times))


# --------------------------------------------------------------------------- report


def render(results: Sequence[Result], skipped: Sequence[str], factory: Factory) -> str:
    """The table, the skipped backends and the recommendation."""
    best = _best(results)
    rows = [_row(result, result is best) for result in results]
    header = ["backend", "num_envs", "env-steps/s", "step p50", "step p99", "peak RSS", ""]
    parts = [f"{factory.target}: env-steps per second through the await API", ""]
    parts.append(format_table(header, rows))
    if skipped:
        parts += ["", "Skipped: " + "; ".join(skipped) + "."]
    parts += ["", recommend(results, factory)]
    return "\n".join(parts)


def _row(result: Result, best: bool) -> list[str]:
    config = result.config
    if result.times is None:
        return [config.kind, str(config.num_envs), "-", "-", "-", "-", f"failed: {_why(result)}"]
    times = result.times
    rss = "n/a" if result.peak_rss is None else f"{result.peak_rss / 2**20:,.0f} MiB"
    return [
        config.kind,
        str(config.num_envs),
        f"{times.rate:,.0f}",
        f"{times.percentile_ms(50):.2f} ms",
        f"{times.percentile_ms(99):.2f} ms",
        rss,
        "<- fastest" if best else "",
    ]


def _best(results: Sequence[Result]) -> Result | None:
    measured = [r for r in results if r.times is not None]
    return max(measured, key=_rate, default=None)


def _rate(result: Result) -> float:
    return result.times.rate if result.times is not None else 0.0


def recommend(results: Sequence[Result], factory: Factory) -> str:
    """The fastest configuration, its code, and the best backend for each ``num_envs``."""
    best = _best(results)
    if best is None:
        return "Every configuration failed: see the reasons above (--traceback shows where)."
    assert best.times is not None
    lines = [
        f"Fastest: {best.config.kind} with {best.config.num_envs} envs, "
        f"{best.times.rate:,.0f} env-steps/s:",
        f"    {best.config.code(factory.name)}",
        "",
        "Best backend for each num_envs (more envs per step: more throughput, and a "
        "bigger batch for your learner):",
    ]
    for n in sorted({r.config.num_envs for r in results}):
        same_n = [r for r in results if r.config.num_envs == n and r.times is not None]
        if not same_n:
            continue
        top = max(same_n, key=_rate)
        inline = next((r for r in same_n if r.config.backend == "inline"), None)
        versus = ""
        if inline is not None and inline is not top:
            versus = f" ({_rate(top) / _rate(inline):.1f}x inline)"
        lines.append(f"  {n:>6} envs: {top.config.kind}, {_rate(top):,.0f} env-steps/s{versus}")
    return "\n".join(lines)


def plot(results: Sequence[Result], path: Path, title: str) -> None:
    """Env-steps per second against ``num_envs``, one line per backend (needs matplotlib)."""
    from matplotlib.figure import Figure  # noqa: PLC0415  (optional extra "plot")

    figure = Figure(figsize=(6.4, 4.0), layout="constrained")
    axes = figure.add_subplot()
    for kind in dict.fromkeys(r.config.kind for r in results):
        points = [
            (r.config.num_envs, _rate(r)) for r in results if r.config.kind == kind and r.times
        ]
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
    return _short(f"{type(result.error).__name__}: {result.error}")


def _failed(what: str, exc: BaseException) -> str:
    return f"{what} raised {_short(f'{type(exc).__name__}: {exc}')}."


def _short(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


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
            "env-steps/s, step latency and memory, and recommend the fastest configuration."
        ),
    )
    parser.add_argument(
        "target", metavar="MODULE:FACTORY", help="e.g. mypackage.envs:make_env or envs.py:make_env"
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
        help="seconds of timed steps per configuration (default: 1)",
    )
    parser.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="draw env-steps/s vs num_envs"
    )
    parser.add_argument(
        "--traceback", action="store_true", help="show the traceback of a failing factory or env"
    )
    parser.set_defaults(run=run)


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
        factory = load_factory(args.target)
        kind = probe(factory)
    except FactoryError as exc:
        _print_factory_error(exc, args.target, show_traceback=args.traceback)
        return USAGE_ERROR
    configs, skipped = plan(kind, args.backends, args.num_envs, args.workers)
    print(
        f"Measuring {args.target} ({kind} envs): {len(configs)} configurations, "
        f"about {args.seconds:g} s of steps each.",
        file=sys.stderr,
    )
    results = _measure_all(factory, configs, args.seconds, show_traceback=args.traceback)
    print(render(results, skipped, factory))
    if args.plot is not None and any(r.times for r in results):
        plot(results, args.plot, f"aiovec bench {args.target}")
        print(f"\nPlot written to {args.plot}")
    return 0 if any(r.times for r in results) else 1


def _measure_all(
    factory: Factory, configs: Sequence[Config], seconds: float, *, show_traceback: bool
) -> list[Result]:
    progress = Progress(len(configs))
    results: list[Result] = []
    try:
        for config in configs:
            progress.phase(f"{config.kind}, {config.num_envs} envs")
            results.append(measure(factory, config, seconds))
            progress.advance()
            error = results[-1].error
            if show_traceback and error is not None:
                progress.close()
                traceback.print_exception(error, file=sys.stderr)
    except KeyboardInterrupt:
        progress.close()
        if results:
            print(render(results, [], factory))
        raise
    finally:
        progress.close()
    return results


def _print_factory_error(exc: FactoryError, target: str, *, show_traceback: bool) -> None:
    if show_traceback and exc.__cause__ is not None:
        traceback.print_exception(exc.__cause__, file=sys.stderr)
        print(file=sys.stderr)
    more = ""
    if exc.__cause__ is not None and not show_traceback:
        more = " Run again with --traceback to see where."
    print(f"aiovec bench: cannot use the env factory {target}: {exc}{more}", file=sys.stderr)
