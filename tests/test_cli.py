"""``python -m aiovec demo`` and ``python -m aiovec bench``."""

from __future__ import annotations

import io
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import aiovec
from aiovec.__main__ import INTERRUPTED, main
from aiovec._cli import bench, demo
from aiovec._cli.args import int_list
from aiovec._cli.factory import Factory, load_factory, probe
from aiovec._cli.memory import tree_rss
from aiovec._cli.report import LARGE_N, Progress, StepTimes, format_table, large_n_advice

SMALL_DEMO = ["demo", "--num-envs", "4", "--steps", "4", "--latency", "0.001"]
PACKAGE_ROOT = str(Path(aiovec.__file__).resolve().parents[1])


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "aiovec-game-server"]


# --------------------------------------------------------------------------- demo


def test_demo_prints_the_three_ways_and_a_conclusion(capsys):
    assert main(SMALL_DEMO) == 0
    out = capsys.readouterr().out
    assert "4 network envs" in out
    assert "(a) one after another (gymnasium SyncVectorEnv)" in out
    assert '(b) aiovec.BlockingVectorEnv, backend="inline"' in out
    assert '(c) aiovec.AsyncioVectorEnv + await, backend="inline"' in out
    for column in ("env-steps/s", "step p50", "step p99", "speed-up"):
        assert column in out
    assert "(a) was timed over 3 steps, (b) and (c) over 4 each" in out
    assert out.rstrip().splitlines()[-1].startswith(("aiovec stepped 4", "With 1 ms per reply"))


@pytest.mark.parametrize("backend", ["inline", "thread", "process"])
def test_demo_times_every_step_on_every_backend(backend):
    settings = demo.DemoSettings(num_envs=3, latency=0.001, jitter=0.0, steps=5, backend=backend)
    rows = demo.run_demo(settings, Progress(1, stream=io.StringIO()))
    assert [row.times.steps for row in rows] == [3, 5, 5]
    assert all(row.times.num_envs == 3 and row.times.rate > 0 for row in rows)
    assert f'backend="{backend}"' in rows[1].name
    assert not server_threads()
    assert not multiprocessing.active_children()


def test_demo_leaves_nothing_open():
    main(SMALL_DEMO)  # first run: lazy imports and one-time set-up
    before = open_fds()
    main(SMALL_DEMO)
    assert open_fds() == before
    assert not server_threads()


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt here, even if the test run started with it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def interrupt_at(monkeypatch, count):
    """Make the ``count``-th step's progress report deliver a real SIGINT."""
    calls = []
    advance = Progress.advance

    def advance_then_interrupt(self, units=1):
        calls.append(units)
        if len(calls) == count:
            signal.raise_signal(signal.SIGINT)
        advance(self, units)

    monkeypatch.setattr(Progress, "advance", advance_then_interrupt)
    return calls


@pytest.mark.parametrize(
    ("backend", "count"),
    [
        ("inline", 1),  # (a) one after another
        ("inline", 4),  # (b) BlockingVectorEnv
        ("inline", 8),  # (c) the await API
        ("thread", 5),
        ("process", 5),
        ("process", 9),
    ],
)
def test_ctrl_c_closes_the_server_and_every_env(monkeypatch, capsys, sigint_raises, backend, count):
    main(SMALL_DEMO)  # lazy imports and one-time set-up happen outside the fd count
    before = open_fds()
    calls = interrupt_at(monkeypatch, count)
    status = main([*SMALL_DEMO, "--backend", backend])
    assert status == INTERRUPTED
    assert len(calls) == count  # it stopped right there
    assert "interrupted" in capsys.readouterr().err
    assert not server_threads()
    assert not multiprocessing.active_children()
    if backend != "process":  # a forkserver, once started, keeps its pipe for good
        assert open_fds() == before


def test_ctrl_c_in_a_terminal_stops_the_demo_cleanly():
    command = [sys.executable, "-m", "aiovec", "demo", "--num-envs", "4", "--steps", "2000"]
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # A shell may start tests with SIGINT ignored; a terminal's Ctrl-C is not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    ) as process:
        assert process.stderr is not None
        for line in process.stderr:  # the progress announces each phase on its own line
            if "(b)" in line:
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    assert process.returncode == INTERRUPTED, err
    assert "interrupted" in err
    assert "Traceback" not in err
    assert "speed-up" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-envs", "0"], "--num-envs: expected an int >= 1, got 0"),
        (["--steps", "x"], "--steps: expected an int >= 1, got 'x'"),
        (["--latency", "-1"], "--latency: expected a number >= 0, got -1"),
        (["--latency", "nan"], "--latency: expected a number >= 0, got 'nan'"),
        (["--backend", "gpu"], "--backend: invalid choice: 'gpu'"),
    ],
)
def test_demo_refuses_bad_options(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def demo_rows(num_envs):
    """The demo's three rows, as if measured: (a) one step a second, (b) and (c) ten."""
    slow, fast = StepTimes(num_envs, (1.0,) * 3), StepTimes(num_envs, (0.1,) * 4)
    return [demo.Row("(a)", slow), demo.Row("(b)", fast), demo.Row("(c)", fast)]


@pytest.mark.parametrize(("num_envs", "advised"), [(LARGE_N - 1, False), (LARGE_N, True)])
def test_demo_points_to_the_gc_advice_from_a_thousand_envs(num_envs, advised):
    text = demo.render(demo_rows(num_envs), demo.DemoSettings(num_envs=num_envs))
    last = text.splitlines()[-1]
    assert (last == large_n_advice(num_envs)) is advised
    assert ("Running 1,000-100,000 envs" in text) is advised


# --------------------------------------------------------------------------- bench

ENVS_PY = """
import asyncio
import time

import gymnasium
import numpy as np


class Counter(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), float(action), False, False, {}


class AsyncCounter:
    observation_space = Counter.observation_space
    action_space = Counter.action_space

    async def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    async def step(self, action):
        await asyncio.sleep(0)
        return np.zeros(2, np.float32), 1.0, False, False, {}

    async def close(self):
        pass


class Sized(Counter):
    def __init__(self, size, level="easy"):
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (size,), np.float32)
        self.level = level

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        assert self.level == "hard"
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.float32), 1.0, False, False, {}


class Blocking(Counter):
    def step(self, action):
        time.sleep(0.002)  # a blocking request
        return super().step(action)


class Crashing(Counter):
    def step(self, action):
        raise ZeroDivisionError("the physics blew up")


def make_env():
    return Counter()


def make_async_env():
    return AsyncCounter()


def make_blocking_env():
    return Blocking()


def make_cartpole():
    return gymnasium.make("CartPole-v1")


def make_crashing_env():
    return Crashing()


def broken():
    raise ValueError("no such level: 7")


def needs_arg(size):
    return Counter()


def not_an_env():
    return 42


LEVEL = 3
"""


@pytest.fixture
def envs_py(tmp_path):
    """A user's file of env factories, outside the package."""
    path = tmp_path / "user_code" / "my_envs.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(ENVS_PY))
    return path


FAST = ["--seconds", "0.02", "--num-envs", "2,4"]


def test_bench_measures_a_factory_from_a_user_file_on_every_backend(envs_py, capsys):
    assert main(["bench", f"{envs_py}:make_env", *FAST, "--workers", "1,2"]) == 0
    out = capsys.readouterr().out
    table = out.split("Skipped")[0]
    for kind in ("inline", "thread", "process, 1 worker", "process, 2 workers"):
        assert table.count(f"\n{kind}  ") == 2, kind  # num_envs 2 and 4, lock-step
        assert table.count(f"\n{kind} + Collector ") == 2, kind  # and partial stepping
    assert "failed" not in out  # the worker processes got the factory by value
    assert "ray: " in out  # skipped, with the reason
    assert "Recommended: " in out
    assert "aiovec.AsyncioVectorEnv([make_env] * " in out
    assert "median of 3 interleaved repeats" in out
    assert out.count("<- recommended") == 1
    assert "MiB" in out
    assert "blocking env" not in out


def test_bench_imports_module_colon_factory(envs_py, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(envs_py.parent))
    monkeypatch.delitem(sys.modules, "my_envs", raising=False)
    assert main(["bench", "my_envs:make_env", *FAST, "--backends", "inline"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("my_envs:make_env: env-steps per second")
    assert "aiovec.AsyncioVectorEnv([make_env] * " in out


def test_bench_skips_the_thread_backend_for_async_envs(envs_py, capsys):
    args = ["bench", f"{envs_py}:make_async_env", *FAST, "--backends", "inline,thread"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "thread: runs synchronous envs only" in out
    assert "\ninline " in out


def test_bench_reports_envs_that_fail_while_stepping(envs_py, capsys):
    args = ["bench", f"{envs_py}:make_crashing_env", *FAST, "--backends", "inline"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert out.count("failed: EnvError: env 0 failed in step()") == 4  # lock-step, collector
    assert "ZeroDivisionError" in out
    assert "Every configuration failed" in out


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("broken", "calling broken() raised ValueError: no such level: 7."),
        ("needs_arg", "missing 1 required positional argument: 'size'. It must take no arguments"),
        ("nope", "has no attribute 'nope'; it defines these callables: "),
        ("LEVEL", "is not callable (it is 3)"),
        (
            "not_an_env",
            "not_an_env() must return an env (an aiovec.AsyncEnv or gymnasium.Env), got int",
        ),
    ],
)
def test_bench_explains_a_bad_factory_in_one_paragraph(envs_py, capsys, factory, message):
    assert main(["bench", f"{envs_py}:{factory}"]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert f"cannot use the env factory {envs_py}:{factory}" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_bench_lists_the_callables_a_file_defines(envs_py, capsys):
    main(["bench", f"{envs_py}:nope"])
    err = capsys.readouterr().err
    assert "make_async_env, make_blocking_env, make_cartpole, make_crashing_env, make_env" in err


def test_bench_passes_env_kwargs_to_the_factory(envs_py, capsys):
    kwargs = '{"size": 5, "level": "hard"}'
    args = ["bench", f"{envs_py}:Sized", *FAST, "--backends", "inline,process", "--workers", "1"]
    assert main([*args, "--env-kwargs", kwargs]) == 0
    out = capsys.readouterr().out
    assert "failed" not in out  # the workers got the bound arguments too
    assert "[lambda: Sized(size=5, level='hard')] * " in out


def test_bench_without_the_kwargs_a_factory_needs_says_how_to_pass_them(envs_py, capsys):
    assert main(["bench", f"{envs_py}:needs_arg"]) == 2
    assert "pass them with --env-kwargs" in capsys.readouterr().err


def test_bench_warns_when_a_blocking_env_runs_inline(envs_py, capsys):
    args = ["bench", f"{envs_py}:make_blocking_env", *FAST, "--backends", "inline,thread"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Warning: make_blocking_env looks like a blocking env. On inline with" in out
    assert 'Use backend="thread"' in out


def test_bench_traceback_flag_shows_where_the_factory_failed(envs_py, capsys):
    assert main(["bench", f"{envs_py}:broken", "--traceback"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert 'raise ValueError("no such level: 7")' in err
    assert "--traceback to see where" not in err


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "make_env",
            "expected MODULE:FACTORY, path/to/file.py:FACTORY or a gymnasium registry id, "
            "got 'make_env'",
        ),
        ("no_such_module_here:make_env", "no module named 'no_such_module_here'"),
        ("missing/envs.py:make_env", "no such file: missing/envs.py."),
    ],
)
def test_bench_explains_a_bad_target(capsys, target, message):
    assert main(["bench", target]) == 2
    assert message in capsys.readouterr().err


def test_bench_reports_a_file_that_fails_to_import(tmp_path, capsys):
    path = tmp_path / "bad.py"
    path.write_text("import numpy\ndef make_env(:\n")
    assert main(["bench", f"{path}:make_env"]) == 2
    err = capsys.readouterr().err
    assert f"running {path} raised SyntaxError" in err
    assert "Traceback" not in err


def test_bench_plot_draws_a_png(envs_py, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason='needs the "plot" extra: pip install "aiovec[plot]"')
    png = tmp_path / "bench.png"
    args = [
        "bench",
        f"{envs_py}:make_env",
        *FAST,
        "--backends",
        "inline,thread",
        "--plot",
        str(png),
    ]
    assert main(args) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Plot written to {png}" in capsys.readouterr().out


def test_bench_plot_without_matplotlib_says_what_to_install(envs_py, tmp_path, monkeypatch, capsys):
    find_spec = bench.importlib.util.find_spec
    monkeypatch.setattr(
        bench.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a),
    )
    png = tmp_path / "bench.png"
    assert main(["bench", f"{envs_py}:make_env", "--plot", str(png)]) == 2
    assert 'pip install "aiovec[plot]"' in capsys.readouterr().err
    assert not png.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-envs", "8,0"], "--num-envs: expected an int >= 1, got 0"),
        (["--backends", "inline,gpu"], "--backends: expected comma-separated backends among"),
        (["--seconds", "0"], "--seconds: expected a number > 0, got 0"),
        (["--repeats", "2"], "--repeats: expected at least 3 (a spread and the tie rule"),
        (["--env-kwargs", "size=7"], "--env-kwargs: expected a JSON object such as"),
        (
            ["--env-kwargs", "[7]"],
            "--env-kwargs: expected a JSON object such as '{\"size\": 7}', got list",
        ),
    ],
)
def test_bench_refuses_bad_options(capsys, args, message):
    with pytest.raises(SystemExit):
        main(["bench", "x:y", *args])
    assert message in capsys.readouterr().err


def test_plan_covers_backends_sizes_and_worker_counts():
    configs, skipped = bench.plan("sync", ["inline", "process", "ray"], [1, 4], [1, 2], cores=8)
    assert configs == [
        bench.Config("inline", 1),
        bench.Config("inline", 4),
        bench.Config("process", 1, 1),  # never more workers than envs
        bench.Config("process", 4, 1),
        bench.Config("process", 4, 2),
    ]
    assert len(skipped) == 1
    assert skipped[0].startswith("ray: ")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins workers: Linux only")
def test_plan_tries_both_placements_where_the_default_pins_a_worker_per_cpu():
    configs, _ = bench.plan("sync", ["process"], [4], [1, 2], cores=2, partial=True)
    assert configs == [
        bench.Config("process", 4, 1),
        bench.Config("process", 4, 2),
        bench.Config("process", 4, 2, unpinned=True),
        bench.Config("process", 4, 1, collector=True),
        bench.Config("process", 4, 2, collector=True),
        bench.Config("process", 4, 2, collector=True, unpinned=True),
    ]
    unpinned = configs[2]
    assert unpinned.kind == "process, 2 workers, cpus=None"
    assert unpinned.backend_options == {"cpus": None}
    assert 'backend_options={"cpus": None}' in unpinned.code("make")
    assert configs[1].backend_options is None
    # within the noise, the default placement is the simpler one
    assert (
        bench.simplicity(configs[1])
        < bench.simplicity(unpinned)
        < bench.simplicity(bench.Config("process", 4, 4))
    )


def test_bench_measures_both_placements(envs_py, capsys):
    cores = len(bench.usable_cpus())
    args = ["--backends", "process", "--workers", str(cores), "--num-envs", str(cores)]
    assert main(["bench", f"{envs_py}:make_env", *FAST, *args, "--no-collector"]) == 0
    out = capsys.readouterr().out
    assert f"process, {cores} worker{'s' * (cores > 1)} " in out
    if hasattr(os, "sched_setaffinity"):
        assert f"process, {cores} worker{'s' * (cores > 1)}, cpus=None " in out


def test_plan_adds_partial_stepping_through_the_collector():
    configs, _ = bench.plan("async", ["inline"], [4, 16], [1], partial=True)
    assert configs == [
        bench.Config("inline", 4),
        bench.Config("inline", 16),
        bench.Config("inline", 4, collector=True),
        bench.Config("inline", 16, collector=True),
    ]


def test_bench_measures_the_collector_unless_told_not_to(envs_py, capsys):
    target = f"{envs_py}:make_async_env"
    assert main(["bench", target, *FAST, "--backends", "inline"]) == 0
    assert capsys.readouterr().out.count("\ninline + Collector ") == 2
    assert main(["bench", target, *FAST, "--backends", "inline", "--no-collector"]) == 0
    assert "Collector" not in capsys.readouterr().out


def result(backend, num_envs, rates, workers=None, *, collector=False):
    """A measured result whose repeats ran at ``rates`` env-steps/s (one step each)."""
    repeats = tuple(StepTimes(num_envs, (num_envs / rate,)) for rate in rates)
    return bench.Result(bench.Config(backend, num_envs, workers, collector), repeats)


def test_the_collector_is_recommended_only_where_it_is_faster():
    step = result("inline", 64, (980.0, 1000.0, 1020.0))
    tied = result("inline", 64, (990.0, 1010.0, 1030.0), collector=True)
    choice = bench.choose([tied, step])
    assert choice is not None
    assert choice.pick is step  # within the noise: lock-step is simpler
    faster = result("inline", 64, (9000.0, 10000.0, 11000.0), collector=True)
    choice = bench.choose([step, faster])
    assert choice is not None
    assert choice.pick is faster
    text = bench.recommend([step, faster], Factory("e.py:make", "make", object))
    assert text.splitlines()[1:3] == [
        '    venv = aiovec.AsyncioVectorEnv([make] * 64, backend="inline")',
        "    collector = aiovec.Collector(venv, policy, segment_length=8, batch_size=8)"
        "  # docs/collector.md",
    ]


def test_the_rate_is_the_median_of_the_repeats_and_the_spread_half_their_range():
    measured = result("inline", 8, (900.0, 1000.0, 1200.0))
    assert measured.rates == pytest.approx((900.0, 1000.0, 1200.0))
    assert measured.rate == pytest.approx(1000.0)
    assert measured.spread == pytest.approx(0.15)
    failed = bench.Result(bench.Config("inline", 8), error=RuntimeError("x"))
    assert (failed.rates, failed.rate, failed.times) == ((), 0.0, None)


def test_merge_keeps_every_repeat_the_highest_peak_and_the_first_error():
    config = bench.Config("inline", 4)
    one, two = StepTimes(4, (0.01,)), StepTimes(4, (0.02,))
    boom = RuntimeError("boom")
    merged = bench.merge([bench.Result(config, (one,), 10), bench.Result(config, (two,), 30)])
    assert (merged.repeats, merged.peak_rss, merged.error) == ((one, two), 30, None)
    failed = bench.merge([bench.Result(config, (one,), 10), bench.Result(config, error=boom)])
    assert failed.error is boom
    assert failed.times is None


def test_within_noise_means_the_ranges_of_the_repeats_overlap():
    assert bench.within_noise([90, 100, 110], [105, 120, 130])
    assert bench.within_noise([105, 120, 130], [90, 100, 110])
    assert not bench.within_noise([90, 100, 104], [105, 120, 130])  # slower in every repeat


def test_the_tie_rule_recommends_the_simplest_within_the_noise_of_the_fastest():
    inline = result("inline", 8, (980.0, 1000.0, 1020.0))
    process = result("process", 8, (990.0, 1040.0, 1060.0), workers=2)  # faster median
    thread = result("thread", 8, (700.0, 710.0, 720.0))  # surely slower
    choice = bench.choose([process, thread, inline])
    assert choice is not None
    assert choice.fastest is process
    assert choice.pick is inline
    assert choice.tied == (process,)
    text = bench.recommend([process, thread, inline], Factory("e.py:make", "make", object))
    assert text.splitlines()[:3] == [
        "Recommended: inline with 8 envs, 1,000 env-steps/s +/-2%:",
        '    aiovec.AsyncioVectorEnv([make] * 8, backend="inline")',
        "  Tied: the fastest, process, 2 workers with 8 envs (1,040 env-steps/s +/-3%), is "
        "within the noise of it (their repeats overlap), so the simpler configuration is "
        "recommended.",
    ]
    assert "8 envs: inline, 1,000 env-steps/s +/-2% (tied with process, 2 workers: the " in text


def test_the_tie_rule_keeps_a_configuration_faster_in_every_repeat():
    inline = result("inline", 8, (980.0, 1000.0, 1030.0))
    process = result("process", 8, (1100.0, 1200.0, 1250.0), workers=2)
    choice = bench.choose([inline, process])
    assert choice is not None
    assert (choice.pick, choice.tied) == (process, ())


def test_simplicity_orders_backends_then_workers_then_envs():
    configs = [
        bench.Config("ray", 8),
        bench.Config("process", 8, 2),
        bench.Config("process", 8, 1),
        bench.Config("process", 4, 1),
        bench.Config("thread", 8),
        bench.Config("inline", 32),
        bench.Config("inline", 8),
    ]
    assert sorted(configs, key=bench.simplicity) == configs[::-1]


@pytest.mark.parametrize(
    ("wall", "cpu", "env_steps", "blocking"),
    [
        (1.0, 0.05, 64, True),  # 95% off the CPU, ~15 ms per env-step: waiting in calls
        (1.0, 0.95, 64, False),  # on the CPU: a CPU-bound env
        (1.0, 0.40, 10_000, False),  # mostly off the CPU, but 60 us per env-step: noise
        (1.0, 0.55, 64, False),  # less than half off the CPU
    ],
)
def test_looks_blocking(wall, cpu, env_steps, blocking):
    assert bench.looks_blocking(wall, cpu, env_steps) is blocking


def test_recommendation_names_the_best_per_size_and_the_factory_with_its_kwargs():
    factory = Factory("envs.py:make", "make", object, {"size": 7})
    results = [
        result("inline", 8, (2000.0, 2000.0, 2000.0)),
        result("process", 8, (4000.0, 4100.0, 4200.0), workers=2),
        result("inline", 32, (8000.0, 8100.0, 8200.0)),
        bench.Result(bench.Config("thread", 32), error=RuntimeError("boom")),
    ]
    text = bench.recommend(results, factory)
    assert text.splitlines()[:2] == [
        "Recommended: inline with 32 envs, 8,100 env-steps/s +/-1%:",
        '    aiovec.AsyncioVectorEnv([lambda: make(size=7)] * 32, backend="inline")',
    ]
    assert "8 envs: process, 2 workers, 4,100 env-steps/s +/-2% (2.0x inline)" in text
    assert "32 envs: inline, 8,100 env-steps/s +/-1%" in text
    table = bench.render(results, ["ray: planned"], factory)
    assert "failed: RuntimeError: boom" in table
    assert "Skipped: ray: planned." in table


def test_the_table_has_no_rule_under_the_note_column():
    factory = Factory("envs.py:make", "make", object)
    table = bench.render([result("inline", 8, (1.0e3, 1.0e3, 1.0e3))], [], factory)
    header, rule = table.splitlines()[2:4]
    assert header.endswith("peak RSS")
    assert rule.endswith("--------")  # under "peak RSS", and nothing after it
    assert len(rule) == len(header)


def test_recommendation_when_everything_failed():
    failed = [bench.Result(bench.Config("inline", 8), error=RuntimeError("x"))]
    assert bench.recommend(failed, Factory("m:f", "f", object)).startswith("Every")


@pytest.mark.parametrize(("sizes", "advised"), [((8, LARGE_N - 1), False), ((8, LARGE_N), True)])
def test_bench_points_to_the_gc_advice_when_a_size_reaches_a_thousand_envs(sizes, advised):
    factory = Factory("envs.py:make", "make", object)
    results = [result("inline", n, (1.0e4, 1.0e4, 1.0e4)) for n in sizes]
    text = bench.render(results, [], factory)
    assert (text.splitlines()[-1] == large_n_advice(max(sizes))) is advised
    assert ("docs/performance.md" in text) is advised


# --------------------------------------------------------------------------- vector entry points

ENTRY = bench.ENTRY_POINT


def test_bench_takes_a_registry_id_and_names_its_vector_entry_point(capsys):
    args = ["bench", "CartPole-v1", *FAST, "--backends", "inline", "--no-collector"]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(bench.ENTRY_POINT)]
    assert [row.split()[3] for row in rows] == ["2", "4"]  # measured at each size
    assert "<- recommended" not in "".join(rows)  # gymnasium's, never the recommendation
    assert "[lambda: gymnasium.make('CartPole-v1')] * " in out
    assert re.search(
        r"CartPole-v1 has a vector entry point: gymnasium's own vector env of it made "
        r"[0-9,]+ env-steps/s with [24] envs, [0-9.]+x the recommended\. "
        r'aiovec.make\("CartPole-v1", [24], vectorization_mode="vector_entry_point"\)',
        out,
    )


def test_bench_finds_the_vector_entry_point_of_a_factorys_env(envs_py, capsys):
    """A factory of the user's own that makes a registered env: its id is named too."""
    assert probe(load_factory(f"{envs_py}:make_cartpole")).entry_point == "CartPole-v1"
    assert probe(load_factory(f"{envs_py}:make_env")).entry_point is None
    assert probe(load_factory("Acrobot-v1")).entry_point is None  # an id without one


def test_the_vector_entry_point_is_planned_at_each_size_once():
    configs, _ = bench.plan("sync", ["inline"], [4, 16], [1], partial=True, entry_point=True)
    entries = [c for c in configs if c.backend == bench.ENTRY_POINT]
    assert entries == [bench.Config(bench.ENTRY_POINT, 4), bench.Config(bench.ENTRY_POINT, 16)]


def test_the_vector_entry_point_is_never_the_recommendation():
    """Gymnasium's own vector env is not what the factory makes (it has no wrappers)."""
    inline, entry = result("inline", 8, (1.0e3, 1.0e3, 1.0e3)), result(ENTRY, 8, (1e5, 1e5, 1e5))
    choice = bench.choose([entry, inline])
    assert (choice.pick, choice.fastest) == (inline, inline)
    factory = Factory("CartPole-v1", "gymnasium.make", object, entry_point="CartPole-v1")
    assert "made 100,000 env-steps/s with 8 envs, 100.0x the recommended." in bench.render(
        [entry, inline], [], factory
    )


def test_a_failing_vector_entry_point_is_said_not_recommended():
    factory = Factory("CartPole-v1", "gymnasium.make", object, entry_point="CartPole-v1")
    failed = bench.Result(bench.Config(bench.ENTRY_POINT, 8), error=TypeError("no kwarg x"))
    text = bench.render([result("inline", 8, (1.0e3, 1.0e3, 1.0e3)), failed], [], factory)
    assert "Recommended: inline with 8 envs" in text
    assert "gymnasium's own vector env of it failed here (TypeError: no kwarg x)." in text


# --------------------------------------------------------------------------- shared pieces


def test_step_times():
    times = StepTimes(4, (0.001, 0.003))
    assert times.steps == 2
    assert times.rate == pytest.approx(2000.0)
    assert times.percentile_ms(50) == pytest.approx(2.0)


def test_format_table_aligns_columns():
    text = format_table(["name", "value"], [["a", "1"], ["longer", "1,000"]])
    assert text.splitlines() == [
        "name    value",
        "------  -----",
        "a           1",
        "longer  1,000",
    ]


def test_the_gc_advice_is_one_line_from_large_n_on():
    assert large_n_advice(0) == large_n_advice(LARGE_N - 1) == ""
    for n in (LARGE_N, 100_000):
        advice = large_n_advice(n)
        assert "\n" not in advice
        assert "'Running 1,000-100,000 envs'" in advice
        assert "gc.set_threshold(100_000)" in advice  # the knob that paid most
        assert "gc.freeze() after construction" in advice


def test_int_list_sorts_and_deduplicates():
    assert int_list("32, 8,8") == (8, 32)


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_redraws_in_place_on_a_terminal():
    stream = Terminal()
    progress = Progress(4, stream=stream, width=4)
    progress.phase("warming up")
    progress.advance(4)
    progress.close()
    text = stream.getvalue()
    assert "\r[----]   0%  warming up" in text
    assert "\r[####] 100%  warming up" in text
    assert text.endswith("\n")


def test_progress_prints_one_line_per_phase_elsewhere():
    stream = io.StringIO()
    progress = Progress(4, stream=stream)
    progress.phase("one")
    progress.advance(2)
    progress.phase("two")
    progress.close()
    assert stream.getvalue() == "... one\n... two\n"


CHILD = "import sys; data = b'x' * (64 << 20); print('ready', flush=True); sys.stdin.read()"


def test_tree_rss_counts_child_processes():
    alone = tree_rss()
    assert alone is not None
    with subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"  # its 64 MiB are resident now
        with_child = tree_rss()
        child.stdin.close()
    assert with_child is not None
    assert with_child - alone > 48 << 20
    assert tree_rss(child.pid) in (None, 0)  # gone: nothing left to count
