"""backend="process": start methods, dead workers, and nothing left behind."""

from __future__ import annotations

import asyncio
import mmap
import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import aiovec
from aiovec._core.calls import GetAttr, Reset
from aiovec._core.layout import StepArrays, StepLayout
from aiovec._core.ops import CallOp
from aiovec._runner import Runner
from aiovec.backends import process as process_backend
from aiovec.backends.pool import messages as _messages
from aiovec.backends.pool.host.envs import Envs, build_flow, run
from aiovec.backends.pool.host.worker import Worker
from aiovec.backends.pool.transport import split
from aiovec.backends.process import child
from aiovec.backends.process import watch as _watch
from aiovec.backends.process import wire as _wire
from aiovec.backends.process.table import CompletionTable
from aiovec.backends.process.transport import ProcessTransport
from aiovec.testing import AsyncHangingEnv, Gate, SpaceEnv

START_METHODS = ["fork", "forkserver", "spawn"]


class Hang(gymnasium.Env[np.ndarray, int]):
    """Steps normally until told (via an attribute) to block in its next step."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.hang = False

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {"pid": os.getpid()}

    def step(self, action: int) -> Any:
        if self.hang:
            threading.Event().wait()  # blocks until the worker is killed
        return np.zeros(2, np.float32), 1.0, False, False, {}


class Boom(Exception):
    """An exception that pickles only halfway (its __init__ takes two arguments)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"boom {a} {b}")


class Fails(Hang):
    def step(self, action: int) -> Any:
        raise Boom(1, 2)


def _children() -> list[Any]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("aiovec-worker")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(process_backend, "START_METHOD", request.param)
    return str(request.param)


def _cartpole() -> Any:
    return gymnasium.make("CartPole-v1")


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_same_results_as_inline_for_every_start_method(start_method: str, mode: Any) -> None:
    fns = [_cartpole] * 3
    actions = np.random.default_rng(0).integers(0, 2, size=(60, 3))
    outputs = []
    for backend in ("inline", "process"):
        with aiovec.BlockingVectorEnv(
            fns, backend=backend, num_workers=2, autoreset_mode=mode
        ) as venv:
            got = [venv.reset(seed=5)]
            got += [venv.step(a) for a in actions]
            outputs.append(got)
    inline, process = outputs
    for a, b in zip(inline, process, strict=True):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, dict):
                assert x.keys() == y.keys()
            else:
                np.testing.assert_array_equal(x, y)
    assert not _children()


def test_lambdas_and_closures_as_factories(start_method: str) -> None:
    size = 3
    fns = [lambda: SpaceEnv(spaces.Box(-1.0, 1.0, (size,)), spaces.Discrete(2))] * 2
    with aiovec.BlockingVectorEnv(fns, backend="process") as venv:
        obs, _ = venv.reset(seed=0)
        assert obs.shape == (2, size)


def _hang_fns(n: int) -> list[Any]:
    return [Hang] * n


@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_killed_worker_fails_its_envs_promptly() -> None:
    venv = aiovec.AsyncioVectorEnv(_hang_fns(4), backend="process", num_workers=2)
    try:
        _, infos = await venv.reset(seed=0)
        pids = infos["pid"]
        assert pids[0] == pids[1] != pids[2] == pids[3]
        await venv.set_attr("hang", [True, True, False, False])
        step = asyncio.ensure_future(venv.step(np.zeros(4, np.int64)))
        await asyncio.sleep(0.2)
        assert not step.done()
        os.kill(int(pids[0]), signal.SIGKILL)
        with pytest.raises(aiovec.WorkerDiedError) as info:
            await asyncio.wait_for(step, 10)
        assert set(info.value.errors) == {0, 1}
        assert "SIGKILL" in str(info.value)
        assert not _alive(int(pids[0]))
    finally:
        await venv.close()
    assert not _children()
    assert not any(_alive(int(pid)) for pid in pids)


@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_killed_worker_is_replaced_under_restart() -> None:
    venv = aiovec.AsyncioVectorEnv(
        _hang_fns(4), backend="process", num_workers=2, on_error="restart"
    )
    async with venv:
        _, infos = await venv.reset(seed=0)
        old = infos["pid"]
        await venv.set_attr("hang", [False, True, False, False])
        step = asyncio.ensure_future(venv.step(np.zeros(4, np.int64)))
        await asyncio.sleep(0.2)
        os.kill(int(old[0]), signal.SIGKILL)
        _, rewards, _, truncations, infos = await asyncio.wait_for(step, 20)
        assert truncations.tolist() == [True, True, False, False]
        assert rewards.tolist() == [0.0, 0.0, 1.0, 1.0]
        assert infos["_error"].tolist() == [True, True, False, False]
        new = infos["pid"]
        assert new[0] == new[1] != old[0]
        _, rewards, *_ = await venv.step(np.zeros(4, np.int64))
        assert rewards.tolist() == [0.0, 0.0, 1.0, 1.0]  # NEXT_STEP resets the truncated
        for _ in range(3):
            _, rewards, *_ = await venv.step(np.zeros(4, np.int64))
            assert rewards.tolist() == [1.0] * 4
    assert not _children()


@pytest.mark.asyncio
async def test_stuck_env_is_timed_out_and_its_worker_replaced() -> None:
    venv = aiovec.AsyncioVectorEnv(
        _hang_fns(2), backend="process", num_workers=2, on_error="restart", step_timeout=0.5
    )
    async with venv:
        await venv.reset(seed=0)
        await venv.set_attr("hang", [True, False])
        _, rewards, _, truncations, infos = await venv.step(np.zeros(2, np.int64))
        assert truncations.tolist() == [True, False]
        assert "TimeoutError" in str(infos["error"][0])
        _, rewards, *_ = await venv.step(np.zeros(2, np.int64))
        assert rewards.tolist() == [0.0, 1.0]  # NEXT_STEP resets the truncated env
        _, rewards, *_ = await venv.step(np.zeros(2, np.int64))
        assert rewards.tolist() == [1.0, 1.0]
    assert not _children()


def test_unpicklable_exception_comes_back_as_runtime_error() -> None:
    with aiovec.BlockingVectorEnv([Fails, Hang], backend="process") as venv:
        venv.reset(seed=0)
        with pytest.raises(aiovec.EnvError) as info:
            venv.step(np.zeros(2, np.int64))
    assert set(info.value.errors) == {0}
    error = info.value.errors[0]
    assert isinstance(error, RuntimeError)
    assert "boom 1 2" in str(error)


def test_nothing_left_after_an_env_error() -> None:
    with pytest.raises(aiovec.EnvError):
        aiovec.BlockingVectorEnv([Hang, Hang, _raise], backend="process", num_workers=2)
    assert not _children()


def _raise() -> Any:
    raise ValueError("no env today")


def test_workers_default_to_cores_but_never_more_than_envs() -> None:
    with aiovec.BlockingVectorEnv([Hang] * 1, backend="process") as venv:
        backend = venv.vector_env._backend
        assert isinstance(backend, process_backend.ProcessBackend)
        assert backend.num_workers == 1


def test_workers_default_to_the_cpus_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    usable = os.sched_getaffinity(0)
    monkeypatch.setattr(os, "cpu_count", lambda: len(usable) + 7)  # more CPUs than usable
    with aiovec.BlockingVectorEnv([Hang] * (len(usable) + 3), backend="process") as venv:
        assert _backend_of(venv).num_workers == len(usable)


def test_split_is_contiguous_and_even() -> None:
    assert split(5, 2) == [range(3), range(3, 5)]
    assert split(4, 4) == [range(i, i + 1) for i in range(4)]


class Marks(SpaceEnv):
    """Writes a file when closed (the parent cannot see a child's memory)."""

    def __init__(self, path: str, *args: Any) -> None:
        super().__init__(*args)
        self.path = path

    def close(self) -> None:
        with open(self.path, "a") as f:
            f.write("closed\n")


def test_envs_built_before_a_failed_construction_are_closed_in_workers(tmp_path: Any) -> None:
    path = str(tmp_path / "closed")
    box = spaces.Box(-1.0, 1.0, (2,))
    fns = [lambda: Marks(path, box, spaces.Discrete(2))] * 2
    fns.append(lambda: Marks(path, box, spaces.Discrete(3)))
    with pytest.raises(ValueError, match="action"):
        aiovec.BlockingVectorEnv(fns, backend="process", num_workers=2)
    with open(path) as f:
        assert f.read().count("closed") == 3
    assert not _children()


# -- shared memory ------------------------------------------------------------------


class Odd(gymnasium.Env[np.ndarray, int]):
    """A float32 Box env whose observations at chosen steps do not fit the buffer exactly."""

    observation_space = spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.t = 0
        self.kind = "exact"

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action: int) -> Any:
        self.t += 1
        obs: Any = np.full(2, self.t + action, np.float32)
        reward: Any = float(self.t)
        if self.kind == "float64":  # batching casts it
            obs = obs.astype(np.float64)
        elif self.kind == "shape":  # batching refuses it
            obs = np.zeros(3, np.float32)
        elif self.kind == "reward":  # an odd reward type: batched by message
            reward = np.array(reward)
        elif self.kind == "column":  # the row's values, in another shape
            obs = obs.reshape(2, 1)
        elif self.kind == "scalar":  # a 0-d array
            obs = np.array(self.t, np.float32)
        return obs, reward, False, False, {"t": self.t} if self.t % 2 else {}


def _backend_of(venv: Any) -> process_backend.ProcessBackend:
    backend = venv.vector_env._backend
    assert isinstance(backend, process_backend.ProcessBackend)
    return backend


@pytest.mark.parametrize("kind", ["float64", "reward"])
def test_values_that_do_not_fit_the_buffer_are_batched_like_inline(kind: str) -> None:
    outputs = []
    for backend in ("inline", "process"):
        with aiovec.BlockingVectorEnv([Odd] * 4, backend=backend, num_workers=2) as venv:
            venv.reset(seed=0)
            venv.set_attr("kind", [kind, "exact", "exact", kind])
            outputs.append([venv.step(np.array([0, 1, 0, 1])) for _ in range(3)])
    for (obs_a, rew_a, *_, infos_a), (obs_b, rew_b, *_, infos_b) in zip(*outputs, strict=True):
        np.testing.assert_array_equal(obs_a, obs_b)
        assert obs_a.dtype == obs_b.dtype == np.float32
        np.testing.assert_array_equal(rew_a, rew_b)
        assert infos_a.keys() == infos_b.keys()
        for key in infos_a:
            np.testing.assert_array_equal(infos_a[key], infos_b[key])


def test_an_observation_of_the_wrong_shape_fails_like_inline() -> None:
    errors = []
    for backend in ("inline", "process"):
        with aiovec.BlockingVectorEnv([Odd] * 2, backend=backend, num_workers=2) as venv:
            venv.reset(seed=0)
            venv.set_attr("kind", ["exact", "shape"])
            with pytest.raises(aiovec.EnvError, match="shape") as info:
                venv.step(np.array([0, 1]))
            assert set(info.value.errors) == {1}
            assert isinstance(info.value.errors[1], ValueError)
            errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_step_data_goes_through_shared_memory_that_leaves_nothing_behind() -> None:
    def shm() -> set[str]:
        return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()

    fds_before, shm_before = set(os.listdir("/proc/self/fd")), shm()
    with aiovec.BlockingVectorEnv([_cartpole] * 4, backend="process", num_workers=2) as venv:
        assert _backend_of(venv).shares_memory
        venv.reset(seed=0)
        venv.step(np.zeros(4, np.int64))
    assert shm() == shm_before
    assert set(os.listdir("/proc/self/fd")) <= fds_before
    with open("/proc/self/maps", encoding="utf-8") as maps:
        mapped = maps.read()  # the shared files are unmapped, not only closed
    assert "aiovec-steps" not in mapped
    assert "aiovec-completions" not in mapped
    assert not _children()


def test_spaces_that_cannot_be_laid_out_travel_by_message() -> None:
    text = spaces.Text(4)
    fns = [lambda: SpaceEnv(text, spaces.Discrete(2))] * 2
    outputs = []
    for backend in ("inline", "process"):
        with aiovec.BlockingVectorEnv(fns, backend=backend) as venv:
            if backend == "process":
                assert not _backend_of(venv).shares_memory
            outputs.append([venv.reset(seed=1)[0], venv.step(np.array([0, 1]))[0]])
    assert [list(o) for o in outputs[0]] == [list(o) for o in outputs[1]]


def test_returned_observations_never_change_behind_the_callers_back() -> None:
    with aiovec.BlockingVectorEnv([_cartpole] * 4, backend="process", num_workers=2) as venv:
        venv.reset(seed=0)
        first, *_ = venv.step(np.zeros(4, np.int64))
        kept = first.copy()
        second, *_ = venv.step(np.ones(4, np.int64))
        np.testing.assert_array_equal(first, kept)  # the next step did not overwrite it
        assert not np.shares_memory(first, second)
        second[:] = 99.0  # the caller's array: a later partial reset must not see this
        mask = np.array([True, False, False, False])
        obs, _ = venv.reset(options={"reset_mask": mask})
        assert not (obs[1:] == 99.0).any()


def test_actions_of_another_dtype_travel_by_message_with_the_same_results() -> None:
    actions = np.random.default_rng(1).integers(0, 2, size=(20, 3))
    outputs = []
    for dtype in (np.int64, np.int32):
        with aiovec.BlockingVectorEnv([_cartpole] * 3, backend="process", num_workers=2) as venv:
            venv.reset(seed=3)
            outputs.append([venv.step(a.astype(dtype))[0] for a in actions])
    for a, b in zip(*outputs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_requests_and_replies_larger_than_a_pipe_buffer() -> None:
    big = np.arange(1 << 18, dtype=np.float64)  # 2 MiB, far beyond a pipe's 64 KiB
    with aiovec.BlockingVectorEnv([Hang] * 2, backend="process", num_workers=2) as venv:
        venv.reset(seed=0)
        venv.set_attr("blob", big)
        blobs = venv.get_attr("blob")
        assert all(np.array_equal(blob, big) for blob in blobs)
        venv.step(np.zeros(2, np.int64))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_main_module_without_the_guard_runs_its_workers(tmp_path: Any, method: str) -> None:
    """A worker never imports the main module: a script with no ``__main__`` guard works.

    (It builds its vector env at import: a worker that ran it again would build
    one in every worker, and die trying.)  Its env class and factories are the
    script's own, carried to the workers by value; an id it registers with
    gymnasium is known to the workers too.
    """
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(
        "import gymnasium\n"
        "import numpy as np\n"
        "import aiovec\n"
        "from aiovec.testing import TrivialEnv\n"
        "print('imported', flush=True)\n"
        "class Mine(TrivialEnv):\n"
        "    pass\n"
        "gymnasium.register('Mine-v0', entry_point=Mine)\n"
        "fns = [lambda: Mine(), lambda: gymnasium.make('Mine-v0')]\n"
        "venv = aiovec.BlockingVectorEnv(fns, backend='process', num_workers=2)\n"
        "venv.reset(seed=0)\n"
        "venv.step(np.zeros(2, np.int64))\n"
        "venv.close()\n"
        "print('done', flush=True)\n"
    )
    env = {**os.environ, "AIOVEC_START_METHOD": method}
    done = subprocess.run(
        [sys.executable, str(script)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["imported", "done"]  # the script ran once: no worker ran it


# -- the blocking wait and the whole step -----------------------------------------


class Slow(Hang):
    """Steps in ``delay`` seconds (an attribute; 0 by default)."""

    delay = 0.0

    def step(self, action: int) -> Any:
        if self.delay:
            threading.Event().wait(self.delay)
        return np.full(2, float(action), np.float32), 1.0, False, False, {}


def test_the_loop_is_parked_only_inside_a_blocking_runner() -> None:
    async def probe() -> bool:
        return _watch.loop_parked()

    runner = Runner()
    try:
        assert runner.run(probe()) is True
    finally:
        runner.close()
    assert asyncio.run(probe()) is False  # a running loop: wait through it


def test_a_blocking_step_past_its_timeout_keeps_the_replies_that_came_in_time() -> None:
    # A whole blocking step sleeps until every env is done (the doorbell rings once);
    # at the deadline it must still take env 0's result, which came long before.
    with aiovec.BlockingVectorEnv(
        [Slow] * 2, backend="process", num_workers=2, step_timeout=1.0
    ) as venv:
        venv.reset(seed=0)
        venv.set_attr("delay", [0.0, 3.0])
        with pytest.raises(aiovec.EnvTimeoutError) as info:
            venv.step(np.zeros(2, np.int64))
        assert set(info.value.errors) == {1}


def test_a_whole_step_whose_first_worker_ends_last() -> None:
    with aiovec.BlockingVectorEnv([Slow] * 4, backend="process", num_workers=2) as venv:
        venv.reset(seed=0)
        venv.set_attr("delay", [0.2, 0.0, 0.0, 0.0])
        obs, rewards, *_ = venv.step(np.array([1, 0, 1, 0]))
        np.testing.assert_array_equal(obs[:, 0], [1.0, 0.0, 1.0, 0.0])
        np.testing.assert_array_equal(rewards, [1.0] * 4)


class Tells(Slow):
    """Says something in its info while ``say`` (an attribute) is set."""

    say = False

    def step(self, action: int) -> Any:
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, {"said": 1} if self.say else {}


@pytest.mark.parametrize("teller", [0, 3], ids=["first-worker", "last-worker"])
def test_a_whole_step_with_news_from_one_worker(
    teller: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A whole step whose results are all in the rows reads no message; an env with
    # news (a non-empty info) sends one, and only its worker's pipe is read.
    received: list[int] = []
    real = ProcessTransport._receive

    def counted(self: Any, link: Any, message: Any) -> None:
        received.append(link.group.start)
        real(self, link, message)

    monkeypatch.setattr(ProcessTransport, "_receive", counted)
    actions = np.array([1, 0, 1, 0])
    with (
        aiovec.BlockingVectorEnv([Tells] * 4, backend="process", num_workers=2) as venv,
        aiovec.BlockingVectorEnv([Tells] * 4) as inline,
    ):
        for envs in (venv, inline):
            envs.reset(seed=0)
            envs.set_attr("say", [i == teller for i in range(4)])
        received.clear()
        got, want = venv.step(actions), inline.step(actions)
        assert received == [teller // 2 * 2]  # the teller's worker's message, alone
        assert got[4].keys() == want[4].keys() == {"said", "_said"}
        assert got[4]["said"].tolist() == [1 if i == teller else 0 for i in range(4)]
        np.testing.assert_array_equal(got[4]["_said"], want[4]["_said"])
        for a, b in zip(got[:4], want[:4], strict=True):
            np.testing.assert_array_equal(a, b)
        for envs in (venv, inline):
            envs.set_attr("say", False)
        received.clear()
        got, want = venv.step(actions), inline.step(actions)
        assert received == []  # every result in the rows: no message at all
        assert got[4] == want[4] == {}
        np.testing.assert_array_equal(got[0], want[0])


class SlowThenFails(Slow):
    """Its first step takes ``delay`` seconds; its second raises."""

    steps = 0

    def step(self, action: int) -> Any:
        self.steps += 1
        if self.steps == 2:
            raise ValueError("second step")
        return super().step(action)


def test_an_env_that_fails_after_a_whole_step_is_timed_from_its_own_start() -> None:
    # A whole step writes no per-env start time when it ends cleanly; the step
    # after it must not be timed from an older call's start.
    with aiovec.BlockingVectorEnv([SlowThenFails] * 2, backend="process", num_workers=2) as venv:
        venv.reset(seed=0)
        venv.set_attr("delay", 1.0)  # the last call that writes every env's start
        venv.step(np.zeros(2, np.int64))  # ~1 s, whole
        with pytest.raises(aiovec.EnvError):
            venv.step(np.zeros(2, np.int64))
        latency = _backend_of(venv).latency
        latency.summary()  # spreads the shared samples
        last = [samples[-1] for samples in latency._samples]
        assert all(seconds < 0.9 for seconds in last), last


class _Replies:
    """A worker's sink that keeps what it publishes: ``(seq, body)``, in order."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, Any]] = []

    def stepped(self, seq: int, done: list[int], reply: Any) -> None:
        self.replies.append((seq, reply))

    def called(self, seq: int, locals_: Any, reply: Any) -> None:
        self.replies.append((seq, reply))

    def reply(self, seq: int, body: Any) -> None:
        self.replies.append((seq, body))


class _Hosted:
    """A worker hosted in this process, on rows of its own from row 0."""

    def __init__(self, fns: list[Any], first: int = 0, sink: Any = None) -> None:
        self.loop = child.Loop()
        envs = run(build_flow(fns, first), self.loop)
        assert isinstance(envs, Envs)
        self.sink = _Replies() if sink is None else sink
        self.worker = Worker(envs, self.sink, self.loop)
        self.envs = envs.envs
        layout = StepLayout.of(*envs.spaces, len(fns))
        assert layout is not None
        self.worker.rows.use(layout, mmap.mmap(-1, layout.nbytes), 0)
        assert self.worker.rows.arrays is not None
        self.arrays: StepArrays = self.worker.rows.arrays

    def handle(self, request: Any) -> None:
        """Hand ``request`` to the worker; run it and its calls on the loop to their end."""
        flow = self.worker.handle(request)
        if flow is not None:
            run(flow, self.loop)
        if self.worker.jobs.running:
            loop = self.loop()
            loop.run_until_complete(self.worker.jobs.until(loop.create_future()))

    def step(self, seq: int, *args: Any) -> _messages.StepReply:
        """Step (a `StepRequest`'s fields after ``seq``): its parts, as one reply."""
        self.sink.replies.clear()
        self.handle(_messages.StepRequest(seq, *args))
        reply = _messages.StepReply({}, {}, {}, {})
        for got, part in self.sink.replies:
            assert got == seq
            for name in ("errors", "infos", "finals", "odd"):
                getattr(reply, name).update(getattr(part, name))
        return reply

    def close(self) -> None:
        self.worker.jobs.close()
        self.loop.close()


@pytest.mark.parametrize("mode", list(_wire.MODES))
def test_the_whole_step_request_is_framed_like_any_message(mode: str) -> None:
    seq = (1 << 40) + 3
    for stream, timed in ((False, False), (True, False), (False, True)):
        step = _wire.WholeStep(seq, mode, stream, timed)
        framed = _wire.WholeStep.frame(seq, mode, stream, timed)
        (request,) = _wire.Frames().feed(framed)
        assert _wire.frame(request) == framed
        assert request[0] == _wire.WHOLE != pickle.dumps(None, pickle.HIGHEST_PROTOCOL)[0]
        assert _wire.WholeStep.parse(request) == step


@pytest.fixture
def hosting() -> Iterator[Callable[..., _Hosted]]:
    """Makes `_Hosted` workers, and closes their loops after the test."""
    made: list[_Hosted] = []

    def make(*args: Any, **kwargs: Any) -> _Hosted:
        made.append(_Hosted(*args, **kwargs))
        return made[-1]

    yield make
    for hosted in made:
        hosted.close()


def test_a_group_reads_its_actions_and_resets_from_its_own_rows(
    hosting: Callable[..., _Hosted],
) -> None:
    # Envs 5-7 in a buffer of their own (as a ray actor has): rows 0-2, not 5-7.
    hosted = hosting([Odd] * 3, 5)
    arrays = hosted.arrays
    for j, env in enumerate(hosted.envs):
        env.reset(seed=j)
    arrays.actions[:] = [1, 0, 1]
    arrays.resets[:] = [False, True, False]
    hosted.step(1, range(3), "NextStep", None, None)
    np.testing.assert_array_equal(arrays.observations[:, 0], [2.0, 0.0, 2.0])
    np.testing.assert_array_equal(arrays.rewards, [1.0, 0.0, 1.0])


def test_a_clean_step_is_published_in_the_table_and_news_by_message(
    hosting: Callable[..., _Hosted],
) -> None:
    # Envs with an empty info cost nothing but their done mark; an env with news is
    # marked -seq, and its news is on the reply pipe, written before the mark.
    read, write = os.pipe()
    os.set_blocking(read, False)
    buffer = bytearray(CompletionTable.nbytes(3, 1))
    table = CompletionTable(buffer, 3, 1)
    table.blank()
    bell_read, bell = os.pipe()
    try:
        sink = child.TableSink(write, table, 0, 0, bell)
        hosted = hosting([Odd] * 3, sink=sink)
        arrays = hosted.arrays
        for j, env in enumerate(hosted.envs):
            env.reset(seed=j)
        marks, messages = [], []
        for seq in (7, 8):  # Odd's info is {"t": t} on odd steps only
            arrays.actions[:] = [0, 1, 0]
            arrays.resets[:] = False
            hosted.handle(_messages.StepRequest(seq, range(3), "NextStep", None, None))
            marks.append(table.done.tolist())
            try:
                messages.append(_wire.Frames().feed(os.read(read, 1 << 16)))
            except BlockingIOError:
                messages.append([])
    finally:
        for fd in (read, write, bell_read, bell):
            os.close(fd)
    assert marks == [[-7, -7, -7], [8, 8, 8]]
    assert table.ready.tolist() == [6]
    ((first,), second) = messages
    assert second == []  # the clean step: nothing but the marks
    reply = pickle.loads(first)
    assert isinstance(reply, _messages.Reply)
    body = reply.body
    assert isinstance(body, _messages.StepReply)
    assert (reply.seq, body.errors, body.finals, body.odd) == (7, {}, {}, {})
    assert body.infos == {j: {"t": 1} for j in range(3)}
    np.testing.assert_array_equal(arrays.observations[:, 0], [2.0, 3.0, 2.0])


class AsyncOdd(aiovec.AsyncEnv[np.ndarray, int]):
    observation_space = Odd.observation_space
    action_space = Odd.action_space

    def __init__(self) -> None:
        self.env = Odd()

    async def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return self.env.reset(seed=seed)

    async def step(self, action: int) -> Any:
        return self.env.step(action)


class OddOrFails(Odd):
    def step(self, action: int) -> Any:
        if self.kind == "raise":
            raise ValueError("no step today")
        return super().step(action)


@pytest.mark.parametrize(
    ("fns", "kinds"),
    [
        ([OddOrFails] * 4, ["exact"] * 4),  # contiguous rows, all at once
        ([OddOrFails, AsyncOdd, OddOrFails, OddOrFails], ["exact"] * 4),  # async last
        ([OddOrFails] * 4, ["exact", "exact", "raise", "exact"]),  # a gap
        ([OddOrFails] * 4, ["exact", "float64", "exact", "exact"]),  # env by env
        ([OddOrFails] * 4, ["exact", "reward", "exact", "exact"]),
        ([OddOrFails] * 4, ["exact", "column", "exact", "exact"]),
        ([OddOrFails] * 4, ["column"] * 4),
        ([OddOrFails] * 4, ["exact", "exact", "scalar", "exact"]),
        ([OddOrFails] * 4, ["exact", "shape", "exact", "exact"]),
        ([OddOrFails, AsyncOdd, OddOrFails, OddOrFails], ["column"] * 4),  # rows not in order
        ([OddOrFails, AsyncOdd, OddOrFails, OddOrFails], ["exact", "exact", "scalar", "exact"]),
    ],
)
def test_results_written_together_are_those_written_one_by_one(
    fns: list[Any], kinds: list[str], hosting: Callable[..., _Hosted]
) -> None:
    together, one_by_one = hosting(fns), hosting(fns)
    one_by_one.worker.rows._bulk = None  # every transition through the per-env writer
    replies = []
    for hosted in (together, one_by_one):
        for j, env in enumerate(hosted.envs):
            inner = getattr(env, "env", env)
            inner.reset(seed=j)
            inner.kind = kinds[j]
        for step in range(3):
            hosted.arrays.observations[:] = -1.0  # nothing left from the last step
            reply = hosted.step(step, range(4), "NextStep", [False] * 4, [step % 2, 1, 0, 1])
            errors = {j: type(e) for j, e in reply.errors.items()}
            replies.append((errors, reply.infos, reply.finals, set(reply.odd)))
        hosted.close()
    half = len(replies) // 2
    assert replies[:half] == replies[half:]
    for name in ("observations", "rewards", "terminations", "truncations"):
        np.testing.assert_array_equal(
            getattr(together.arrays, name), getattr(one_by_one.arrays, name)
        )


def test_without_an_alarm_a_streamed_step_pauses_after_each_sync_env(
    hosting: Callable[..., _Hosted],
) -> None:
    # A Ray actor's worker: no alarm cuts a run of sync envs, so each env's part
    # is published as it ends and the flow pauses for it to be sent on.
    hosted = hosting([Odd] * 3)
    for j, env in enumerate(hosted.envs):
        env.reset(seed=j)
    request = _messages.StepRequest(1, range(3), "NextStep", [False] * 3, [0, 1, 0], True)
    flow = hosted.worker.handle(request)
    assert flow is not None
    seen = []
    for coros in flow:
        assert coros == []  # a pause, nothing to await
        seen.append([body.envs for _, body in hosted.sink.replies])
    assert seen == [[[0]], [[0], [1]]]
    (_, last) = hosted.sink.replies[-1]
    assert last.envs is None
    assert set(last.infos) == {2}
    hosted.close()


def test_jobs_answer_a_whole_step_of_sync_envs_once_and_a_timed_one_env_by_env(
    hosting: Callable[..., _Hosted],
) -> None:
    # Without a deadline a step of sync envs is stepped at once and answered once (its
    # flow never pauses); under one, with no alarm (a Ray actor's worker), each sync
    # env's result is published as it ends, so that a deadline blames the env running.
    hosted = hosting([Odd] * 3)
    for j, env in enumerate(hosted.envs):
        env.reset(seed=j)
    whole = _messages.StepRequest(1, range(3), "NextStep", [False] * 3, [0] * 3)
    flow = hosted.worker.handle(whole)
    assert flow is not None
    assert list(flow) == []
    assert [(seq, body.envs) for seq, body in hosted.sink.replies] == [(1, None)]
    hosted.sink.replies.clear()
    timed = _messages.StepRequest(2, range(3), "NextStep", [False] * 3, [0] * 3, timed=True)
    hosted.handle(timed)
    parts = [(seq, body.envs) for seq, body in hosted.sink.replies]
    assert parts == [(2, [0]), (2, [1]), (2, None)]
    hosted.close()


def test_jobs_answer_a_call_once_each_env_s_outcome_in_order_async_envs_as_tasks(
    hosting: Callable[..., _Hosted],
) -> None:
    fns = [Odd, lambda: aiovec.testing.AsyncTwin(Odd(), seed=1), Odd]
    hosted = hosting(fns)
    hosted.envs[0].t = 7
    op = CallOp([GetAttr("t"), GetAttr("t"), GetAttr("missing")], "get_attr")
    assert hosted.worker.handle(_messages.Call(3, range(3), op)) is None
    assert hosted.worker.jobs.running  # the async env's call runs as a task on the loop
    assert hosted.sink.replies == []  # one reply, once every env is done
    loop = hosted.loop()
    loop.run_until_complete(hosted.worker.jobs.until(loop.create_future()))
    ((seq, reply),) = hosted.sink.replies
    assert seq == 3
    assert [value for value, _ in reply.outcomes[:2]] == [7, 0]
    assert reply.outcomes[2][0] is None
    assert isinstance(reply.outcomes[2][1], AttributeError)
    hosted.close()


def test_a_worker_leaves_stop_to_its_transport(hosting: Callable[..., _Hosted]) -> None:
    hosted = hosting([Odd])
    with pytest.raises(TypeError, match=r"a worker cannot handle Stop\(\)"):
        hosted.worker.handle(_messages.Stop())
    hosted.close()


def test_actions_are_split_per_env_only_when_read() -> None:
    from aiovec._core.batching import Batcher

    batcher = Batcher(spaces.Box(-1.0, 1.0, (2,)), spaces.Discrete(3), 4, True)
    batch = np.array([0, 2, 1, 2])
    per_env = batcher.split_actions(batch)
    assert per_env._items is None  # type: ignore[attr-defined]
    assert list(per_env) == [0, 2, 1, 2]
    assert per_env[1:3] == [2, 1]
    assert pickle.loads(pickle.dumps(per_env)) == [0, 2, 1, 2]
    with pytest.raises(ValueError, match="actions"):
        batcher.split_actions(np.array([0, 2]))  # still checked at once


def test_a_blocking_wait_on_descriptors_numbered_past_1023() -> None:
    # select() refuses descriptors >= FD_SETSIZE (1024); a busy process may well have them.
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the open-file limit ({hard}) is too low")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        with aiovec.BlockingVectorEnv([_cartpole] * 2, backend="process", num_workers=2) as venv:
            workers = _backend_of(venv).workers
            assert min(fd for w in workers for fd in (w.reply_fd, w.sentinel)) > 1023
            venv.reset(seed=0)
            obs, *_ = venv.step(np.zeros(2, np.int64))
            assert obs.shape == (2, 4)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _unreadable_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The parent's next message delivery raises (as a bug or a corrupt message would)."""
    real = ProcessTransport._receive
    calls: list[int] = []

    def broken(self: Any, link: Any, message: Any) -> None:
        calls.append(link.group.start)
        if len(calls) == 1:
            raise RuntimeError("cannot read this reply")
        real(self, link, message)

    monkeypatch.setattr(ProcessTransport, "_receive", broken)
    return calls


def test_a_reply_that_cannot_be_read_fails_its_envs_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with aiovec.BlockingVectorEnv([Tells] * 4, backend="process", num_workers=2) as venv:
        venv.reset(seed=0)
        venv.set_attr("say", True)  # every env has news: each worker writes a message
        pids = _backend_of(venv).pids
        calls = _unreadable_once(monkeypatch)
        with pytest.raises(aiovec.WorkerDiedError, match="could not be read") as info:
            venv.step(np.zeros(4, np.int64))
        group = range(calls[0], calls[0] + 2)
        assert set(group) <= set(info.value.errors)
        assert "cannot read this reply" in str(info.value.errors[group[0]])
        assert not _alive(pids[calls[0] // 2])
        venv.reset(seed=1)  # rebuilds the lost envs on a new worker
        obs, *_ = venv.step(np.zeros(4, np.int64))
        assert obs.shape == (4, 2)
    assert not _children()


@pytest.mark.asyncio
async def test_a_reply_that_cannot_be_read_fails_its_envs_through_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with aiovec.AsyncioVectorEnv([Tells] * 4, backend="process", num_workers=2) as venv:
        await venv.reset(seed=0)
        await venv.set_attr("say", True)
        calls = _unreadable_once(monkeypatch)
        with pytest.raises(aiovec.WorkerDiedError, match="could not be read"):
            await venv.step(np.zeros(4, np.int64))
        assert calls
        await venv.reset(seed=1)
        obs, *_ = await venv.step(np.zeros(4, np.int64))
        assert obs.shape == (4, 2)


# -- pinning workers to CPUs ----------------------------------------------------------


def test_workers_are_pinned_round_robin_to_the_cpus_given() -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    with aiovec.BlockingVectorEnv(
        _hang_fns(3), backend="process", num_workers=3, backend_options={"cpus": cpus}
    ) as venv:
        pids = _backend_of(venv).pids
        assert [os.sched_getaffinity(pid) for pid in pids if pid is not None] == [
            {cpus[k % len(cpus)]} for k in range(3)
        ]
        venv.reset(seed=0)
        _, rewards, *_ = venv.step(np.zeros(3, np.int64))
        assert rewards.tolist() == [1.0] * 3
    assert not _children()


@pytest.mark.timeout(30)
def test_by_default_one_worker_per_usable_cpu_is_pinned_to_it() -> None:
    usable = sorted(os.sched_getaffinity(0))
    with aiovec.BlockingVectorEnv(
        _hang_fns(len(usable)), backend="process", num_workers=len(usable)
    ) as venv:
        pids = _backend_of(venv).pids
        assert [os.sched_getaffinity(pid) for pid in pids if pid is not None] == [
            {cpu} for cpu in usable
        ]
    with aiovec.BlockingVectorEnv(
        _hang_fns(len(usable)),
        backend="process",
        num_workers=len(usable),
        backend_options={"cpus": None},
    ) as venv:
        pids = _backend_of(venv).pids
        assert all(os.sched_getaffinity(pid) == set(usable) for pid in pids if pid is not None)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable CPUs")
def test_by_default_fewer_workers_than_cpus_are_not_pinned() -> None:
    usable = os.sched_getaffinity(0)
    with aiovec.BlockingVectorEnv(_hang_fns(2), backend="process", num_workers=1) as venv:
        (pid,) = _backend_of(venv).pids
        assert pid is not None
        assert os.sched_getaffinity(pid) == usable
    assert not _children()


def test_a_rebuilt_worker_is_pinned_like_the_one_it_replaces() -> None:
    cpu = max(os.sched_getaffinity(0))
    with aiovec.BlockingVectorEnv(
        _hang_fns(2), backend="process", num_workers=2, backend_options={"cpus": [cpu]}
    ) as venv:
        venv.reset(seed=0)
        old = _backend_of(venv).pids[0]
        assert old is not None
        os.kill(old, signal.SIGKILL)
        with pytest.raises(aiovec.WorkerDiedError):
            venv.step(np.zeros(2, np.int64))
        venv.reset(seed=1)  # rebuilds env 0 on a new worker
        new = _backend_of(venv).pids[0]
        assert new is not None
        assert new != old
        assert os.sched_getaffinity(new) == {cpu}
    assert not _children()


@pytest.mark.parametrize(
    ("cpus", "error", "match"),
    [
        ("0,1", TypeError, 'must be "auto", None or a sequence of CPU ids, got str'),
        ([], ValueError, "at least one CPU"),
        ([True], TypeError, "must hold ints"),
        ([0.5], TypeError, "must hold ints"),
        ([1 << 20], ValueError, r"CPU\(s\) \[1048576\] that this process may not run on"),
    ],
)
def test_bad_cpus_are_refused_before_any_worker_starts(
    cpus: Any, error: type[Exception], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []
    monkeypatch.setattr(ProcessTransport, "_start", lambda self, w: started.append(w))
    with pytest.raises(error, match=match):
        aiovec.BlockingVectorEnv(_hang_fns(2), backend="process", backend_options={"cpus": cpus})
    assert started == []


def _interrupt_the_write_to(
    worker: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[int], list[int]]:
    """Raise KeyboardInterrupt once, instead of writing a request to worker ``worker``.

    A Ctrl-C that lands after one worker's request is written and before the
    next one's: the parent's state must say that only the first is in flight.
    Returns the list the interruption is noted in, and the one to put the
    descriptor of that worker's request pipe in (``os.write`` to it raises).
    """
    interrupted: list[int] = []
    write = os.write

    def post(fd: int, data: Any) -> int:
        if not interrupted and fd == target[0]:
            interrupted.append(worker)
            raise KeyboardInterrupt
        return write(fd, data)

    target: list[int] = []
    monkeypatch.setattr(os, "write", post)
    return interrupted, target


@pytest.mark.parametrize("call", ["step", "send", "reset"])
def test_ctrl_c_between_two_workers_requests_leaves_the_unwritten_one_out(
    call: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Worker 1 never got its request: it is not blocked in it, so reset() and
    # close() neither wait for it nor replace or kill it.
    actions = np.zeros(4, np.int64)
    with aiovec.BlockingVectorEnv([_cartpole] * 4, backend="process", num_workers=2) as venv:
        venv.reset(seed=0)
        backend = _backend_of(venv)
        pids = backend.pids
        interrupted, target = _interrupt_the_write_to(1, monkeypatch)
        target.append(backend.workers[1].request_fd)  # the request pipe of worker 1
        run = {
            "step": lambda: venv.step(actions),  # the whole step
            "send": lambda: venv.send(actions),  # streamed, its actions in the shared rows
            "reset": lambda: venv.reset(seed=1),  # a call that is pickled
        }[call]
        with pytest.raises(KeyboardInterrupt):
            run()
        assert interrupted == [1]
        assert backend.table.blocked.keys() <= {0}  # worker 0 got its request; worker 1 did not
        obs, _ = venv.reset(seed=2)
        assert obs.shape == (4, 4)
        assert backend.pids == pids  # neither worker replaced
        venv.step(actions)
    assert "replacing" not in caplog.text
    assert "killing" not in caplog.text
    assert not _children()


def test_a_request_to_a_dead_worker_is_failed_by_the_wait_not_by_the_write() -> None:
    """Writing never reads: a request whose pipe is broken delivers no outcome from
    inside ``launch`` (where it would land among other requests being written); the
    worker's sentinel tells the wait, which fails its envs with ``WorkerDiedError``."""
    with aiovec.BlockingVectorEnv([_cartpole] * 4, backend="process", num_workers=2) as venv:
        venv.reset(seed=0)
        backend = _backend_of(venv)
        dead = backend.workers[0]
        dead.process.kill()
        dead.process.join(10)

        async def launch_then_wait() -> tuple[Any, Any]:
            backend.launch(range(4), CallOp([GetAttr("metadata")] * 4, "get_attr"))
            during = backend.take()
            return during, await backend.collect(4)

        (results, errors), (_, after) = venv._runner.run(launch_then_wait())
        assert not errors  # nothing delivered by the writes
        assert not results
        assert sorted(after) == list(dead.group)
        assert all(isinstance(error, aiovec.WorkerDiedError) for error in after.values())
        with pytest.raises(aiovec.WorkerDiedError):
            venv.step(venv.action_space.sample())
        venv.reset(seed=1)  # a new worker for the group
        venv.step(venv.action_space.sample())
    assert not _children()


def test_a_cancel_that_names_a_request_spares_a_later_call_of_the_env(
    hosting: Callable[..., _Hosted], tmp_path: Any
) -> None:
    """A Ray actor runs its methods in no set order, so a cancel of request 1 may come
    after the env's next call (request 2) started: it must not cancel that one.  A
    cancel numbered 0 (the process backend's, kept in order by its pipe) cancels
    whatever runs."""
    gate = Gate(tmp_path)
    cartpole = gymnasium.make("CartPole-v1")
    hosted = hosting([lambda: AsyncHangingEnv(cartpole, gate, method="reset")])
    env, loop = hosted.envs[0], hosted.loop()

    def turn() -> None:  # a few loop iterations: tasks start, or see their cancellation
        for _ in range(3):
            loop.run_until_complete(asyncio.sleep(0))

    hosted.worker.handle(_messages.Call(2, [0], CallOp([Reset(seed=0)], "reset")))
    turn()  # request 2's reset waits on the gate
    hosted.worker.handle(_messages.Cancel(1, [0]))  # a late cancel of an earlier request
    turn()
    assert env.cancelled == 0
    assert hosted.sink.replies == []
    hosted.worker.handle(_messages.Cancel(2, [0]))  # its own request's
    turn()
    assert env.cancelled == 1
    hosted.worker.handle(_messages.Call(3, [0], CallOp([Reset(seed=1)], "reset")))
    hosted.worker.handle(_messages.Cancel(0, [0]))  # numbered 0: whatever runs
    turn()
    replies = dict(hosted.sink.replies)
    assert isinstance(replies[2].outcomes[0][1], asyncio.CancelledError)
    assert isinstance(replies[3].outcomes[0][1], asyncio.CancelledError)
