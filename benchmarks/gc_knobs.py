"""Python's garbage collector and 1,000-100,000 envs that wait: three settings, measured.

Run from the repository root::

    python benchmarks/gc_knobs.py               # N = 1,000, 10,000, 100,000: ~20 min on 2 cores
    python benchmarks/gc_knobs.py --quick       # CI smoke test: N = 1,000 only, < 60 s (rough)
    python benchmarks/gc_knobs.py --sizes 1000,10000 --reps 7 --json gc.json

aiovec never changes a process's garbage collector settings; this measures
what changing them gives a program that steps many envs that wait.  Settings:

``default``
    the interpreter's own: thresholds (700, 10, 10), nothing frozen;
``freeze``
    ``gc.freeze()`` once every candidate is built, reset and stepped once: what
    exists then (the envs, aiovec's lanes and flows, the loop) moves to the
    permanent generation, which collections do not walk;
``threshold``
    ``gc.set_threshold(100_000)`` before anything is built: the youngest
    generation is collected every 100,000 net container allocations instead of
    every 700 (the older generations' thresholds are left as they are).

Each (N, loop, setting) runs in a fresh Python process (this script with
``--child``) that checks it starts from the interpreter's defaults, applies its
setting and prints its figures as JSON: no setting outlives the candidates it
was measured on.  For each N and loop the settings' processes run one after
another, in an order that rotates from one (N, loop) to the next.  The
candidates of one process share its heap and are timed interleaved, medians of
``--reps`` repetitions, with ``benchmarks/io.py``'s pieces (its ``10k`` case,
``run_case`` and ``--no-gc-freeze``):

- ``aiovec await (LOOP)``: ``AsyncioVectorEnv`` on inline over N envs whose
  every step awaits ``asyncio.sleep(0.005)`` (io.py's ``SleepEnv``);
- ``bare asyncio.gather (LOOP)``: one ``gather`` per step over the ``step``
  coroutines of N other such envs (no batching, no autoreset), on the same heap,
  in the same repetitions;
- on asyncio's loop, ``aiovec process, 2 workers``: the same on
  ``backend="process"``, N / 2 envs per worker, each worker with its own loop
  and heap.  Settings do not reach worker processes (each starts a fresh
  interpreter), so each worker applies the setting itself, through
  ``venv.call``, once its envs are built, reset and stepped.

LOOP is asyncio's and, when installed, uvloop's.  Reported per candidate:
milliseconds per vector step (median over repetitions); the ratio to the bare
``gather`` of the same process (median of the paired per-repetition ratios);
the ratio to the same candidate under ``default`` (a ratio of medians measured
in different processes); and, from ``gc.callbacks``, the collections per step
of each generation and the milliseconds spent in them (this process only, not
the workers').  Each timing starts with an untimed ``gc.collect()``, which is
not counted.  Timings never make the script fail; every vector env, worker
and child process is closed on the way out, on errors and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
from _common import benchmark_module, loop_factories, machine_info

io = benchmark_module("io.py")
cloudpickle.register_pickle_by_value(io)  # its SleepEnv travels to the process workers

SETTINGS = ("default", "freeze", "threshold")
THRESHOLD = 100_000  # the raised generation-0 threshold
SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000,)
WORKERS = 2  # process backend workers
CHILD_TIMEOUT = 1_800  # seconds one (N, loop, setting) process may take


def gc_state() -> dict[str, Any]:
    """This process's collector settings: its thresholds, frozen objects, on or off."""
    return {
        "threshold": list(gc.get_threshold()),
        "frozen": gc.get_freeze_count(),
        "enabled": gc.isenabled(),
    }


def apply_setting(setting: str) -> None:
    """Apply ``setting`` to this process; again changes nothing (a worker calls it per env)."""
    if setting == "threshold":
        gc.set_threshold(THRESHOLD)
    elif setting == "freeze" and gc.get_freeze_count() == 0:
        gc.freeze()


_APPLIED: list[tuple[int, int]] = []  # in a worker process: what its first env applied


class KnobEnv(io.SleepEnv):
    """io.py's ``SleepEnv`` (every step awaits 5 ms) that can set its process's collector."""

    def apply_gc_setting(self, setting: str) -> tuple[int, int]:
        """`apply_setting` in this env's process; the gen-0 threshold and the frozen count.

        Every env of a worker asks; the first applies and counts, the others get
        its answer: ``gc.get_freeze_count()`` walks every frozen object, and
        50,000 envs asking in turn would take minutes.
        """
        if not _APPLIED:
            apply_setting(setting)
            _APPLIED.append((gc.get_threshold()[0], gc.get_freeze_count()))
        return _APPLIED[0]


# --------------------------------------------------------------------- child


@dataclass
class Collections:
    """A ``gc.callbacks`` entry: every collection of this process, (generation, seconds)."""

    made: list[tuple[int, float]] = field(default_factory=list)
    _started: float = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.made.append((info["generation"], time.perf_counter() - self._started))


def counted(
    build: Callable[[], Any], log: Collections, timings: dict[str, list[dict[str, Any]]]
) -> Callable[[], Any]:
    """``build``, its candidate recording the collections of each of its timings.

    A timing's first full collection is its own ``gc.collect()``, made before
    its clock starts: it is left out.
    """

    def wrapped() -> Any:
        cand = build()
        run = cand.run
        mine = timings[cand.name] = []

        def run_counted(steps: int) -> float:
            first = len(log.made)
            seconds = run(steps)
            made = log.made[first:]
            own = next((i for i, (gen, _) in enumerate(made) if gen == 2), None)
            if own is not None:
                del made[own]
            per_gen = [sum(gen == g for gen, _ in made) / steps for g in range(3)]
            ms = sum(s for _, s in made) / steps * 1e3
            mine.append({"per_step": per_gen, "ms_per_step": ms, "state": gc_state()})
            return seconds

        cand.run = run_counted
        return cand

    return wrapped


def child(setting: str, num_envs: int, loop: str, steps: int, reps: int) -> dict[str, Any]:
    """One process's measurement: its setting on the candidates of ``loop``, ``num_envs`` each."""
    found = gc_state()
    if found["frozen"] or not found["enabled"]:
        raise RuntimeError(f"the collector did not start from its defaults: {found}")
    if setting == "threshold":
        apply_setting(setting)  # before anything is built, as at a program's start
    factory = loop_factories()[loop]
    fns = [KnobEnv] * num_envs
    workers: dict[str, list[int]] = {}

    async def in_workers(venv: Any) -> None:
        seen = await venv.call("apply_gc_setting", setting)
        workers["threshold"] = sorted({threshold for threshold, _ in seen})
        workers["frozen"] = [min(frozen for _, frozen in seen), max(frozen for _, frozen in seen)]

    builders: list[Callable[[], Any]] = []
    if loop == "asyncio":
        builders.append(
            functools.partial(
                io.aiovec_await,
                f"aiovec process, {WORKERS} workers",
                fns,
                2,
                factory,
                after_build=in_workers,
                backend="process",
                num_workers=WORKERS,
            )
        )
    builders += [
        functools.partial(io.aiovec_await, f"aiovec await ({loop})", fns, 2, factory),
        functools.partial(
            io.bare_gather, f"bare asyncio.gather ({loop})", KnobEnv, num_envs, 2, factory
        ),
    ]
    log = Collections()
    timings: dict[str, list[dict[str, Any]]] = {}
    case = io.Case(
        f"sleep {io.SLEEP * 1e3:g} ms",
        num_envs,
        io.SLEEP,
        [counted(build, log, timings) for build in builders],
        steps,
    )
    args = argparse.Namespace(reps=reps, gc_freeze=setting == "freeze")
    gc.callbacks.append(log)
    try:
        rows = io.run_case(case, args)  # gc.freeze() once built, with args.gc_freeze
    finally:
        gc.callbacks.remove(log)
    for r in rows:
        timed = timings[r["candidate"]][1:]  # the first run is the warm-up
        r["gc_per_step"] = [statistics.median(t["per_step"][g] for t in timed) for g in range(3)]
        r["gc_ms_per_step"] = statistics.median(t["ms_per_step"] for t in timed)
        r["gc_state"] = timed[0]["state"]
        if r["candidate"].startswith("aiovec process"):
            r["worker_gc_states"] = workers
    return {"setting": setting, "num_envs": num_envs, "loop": loop, "found": found, "rows": rows}


# --------------------------------------------------------------------- parent


def steps_for(num_envs: int, quick: bool) -> int:
    """Vector steps per timing: about 40,000 env-steps (5,000 with --quick), at least 2."""
    return max(2, (5_000 if quick else 40_000) // num_envs)


def run_child(setting: str, num_envs: int, loop: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one (N, loop, setting) in a fresh process; its JSON."""
    command = [sys.executable, __file__, "--child", setting, str(num_envs), loop]
    command += ["--reps", str(args.reps), "--steps", str(steps_for(num_envs, args.quick))]
    out = subprocess.run(
        command, check=True, stdout=subprocess.PIPE, text=True, timeout=CHILD_TIMEOUT
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def rotated(items: Sequence[str], by: int) -> list[str]:
    """``items`` starting at index ``by`` (modulo their number)."""
    k = by % len(items)
    return [*items[k:], *items[:k]]


def summarize(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row with its setting, N, its ratio to the bare gather and to ``default``."""
    rows: list[dict[str, Any]] = []
    for res in results:
        for r in res["rows"]:
            rows.append(r | {k: res[k] for k in ("setting", "loop", "found")})
    for r in rows:
        bare = next(
            b
            for b in rows
            if b["setting"] == r["setting"]
            and b["num_envs"] == r["num_envs"]
            and b["loop"] == r["loop"]
            and b["candidate"].startswith("bare asyncio.gather")
        )
        r["x_bare_gather"] = io.time_ratio(r, bare)
        base = next(
            (
                d
                for d in rows
                if d["setting"] == "default"
                and d["num_envs"] == r["num_envs"]
                and d["candidate"] == r["candidate"]
            ),
            None,
        )
        r["x_default"] = None if base is None else r["ms_per_step"] / base["ms_per_step"]
    return rows


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_report(info: dict[str, str], rows: Sequence[dict[str, Any]]) -> None:
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    print()
    print("ms per vector step (x the same candidate under the default setting):")
    print()
    print("| N | candidate | " + " | ".join(SETTINGS) + " |")
    print("|---:|---|" + "---:|" * len(SETTINGS))
    names = dict.fromkeys((r["num_envs"], r["candidate"]) for r in rows)
    for n, name in names:
        cells = []
        for setting in SETTINGS:
            r = next(
                (
                    x
                    for x in rows
                    if (x["num_envs"], x["candidate"], x["setting"]) == (n, name, setting)
                ),
                None,
            )
            cells.append("-" if r is None else f"{r['ms_per_step']:,.1f} ({_x(r['x_default'])})")
        print(f"| {n:,} | {name} | " + " | ".join(cells) + " |")
    print()
    print(
        "| N | candidate | setting | ms/step | x bare gather (same process) "
        "| collections per step, gen 0 / 1 / 2 | ms in the collector per step |"
    )
    print("|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        per_gen = " / ".join(f"{c:.1f}" for c in r["gc_per_step"])
        print(
            f"| {r['num_envs']:,} | {r['candidate']} | {r['setting']} | {r['ms_per_step']:,.1f} "
            f"| {_x(r['x_bare_gather'])} | {per_gen} | {r['gc_ms_per_step']:.1f} |"
        )
    found = {tuple(r["found"]["threshold"]) for r in rows}
    print()
    print(f"each process started with thresholds {', '.join(map(str, found))}, nothing frozen")
    workers = {
        (r["num_envs"], r["setting"]): r["worker_gc_states"]
        for r in rows
        if "worker_gc_states" in r
    }
    if workers:
        print()
        print("process workers' collector, as their envs saw it once the setting was applied:")
        for (n, setting), seen in workers.items():
            low, high = seen["frozen"]
            print(
                f"  N={n:,} {setting}: gen-0 threshold {', '.join(map(str, seen['threshold']))};"
                f" frozen objects {low:,}-{high:,}"
            )


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated ints >= 2, got {text!r}"
        ) from None
    if not sizes or min(sizes) < WORKERS:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints >= 2, got {text!r}")
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke test: N = 1,000 only")
    parser.add_argument("--reps", type=int, help="repetitions (default 5, --quick 2)")
    parser.add_argument(
        "--sizes", type=parse_sizes, help="comma-separated N (default: 1000,10000,100000)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--child", nargs=3, metavar=("SETTING", "N", "LOOP"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.reps is None:
        args.reps = 2 if args.quick else 5
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else SIZES
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as io.py: what a terminal gets
    if args.child:
        setting, n, loop = args.child
        print(json.dumps(child(setting, int(n), loop, args.steps, args.reps)))
        return 0
    started = time.perf_counter()
    info = machine_info()
    results: list[dict[str, Any]] = []
    order = 0
    for n in args.sizes:
        for loop in loop_factories():
            for setting in rotated(SETTINGS, order):
                results.append(run_child(setting, n, loop, args))
                elapsed = time.perf_counter() - started
                print(f"  measured N={n:,} {loop} {setting} ({elapsed:.0f} s)", file=sys.stderr)
            order += 1
    info["load_avg_1min_end"] = machine_info()["load_avg_1min"]
    rows = summarize(results)
    print_report(info, rows)
    elapsed = time.perf_counter() - started
    print(f"\n({args.reps} repetitions, {elapsed:.0f} s in all)")
    if args.json:
        report = {"machine": info, "argv": sys.argv, "reps": args.reps, "quick": args.quick}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report | {"rows": rows, "elapsed_s": elapsed}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
