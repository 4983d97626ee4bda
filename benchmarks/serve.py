"""``aiovec serve`` against the obvious ways of putting envs behind a network, in one run.

Every server runs as a process of its own (``python -m aiovec serve`` for
aiovec), so client and server each have a core of the two.  Repetitions are
interleaved (each candidate in turn, every repetition) and medians reported
with their range.  Server CPU is read from ``/proc`` (user + system time of the
server process), client CPU with ``time.process_time``: both barely move with
the machine's load, unlike the rates.

- **throughput**: trivial envs (``aiovec.testing.TrivialEnv``), N sessions on
  one connection.  aiovec *lock-step* is a ``BlockingVectorEnv.step`` loop (client
  and server take turns); *pipelined* is the same vector env stepped in two
  halves with ``send``/``recv`` (EnvPool's asynchronous mode, the Collector's
  way: the server steps one half while the client takes the other's results),
  counting the env-steps ``recv`` returns.  Baselines: one aiohttp WebSocket
  with a frame per env-step (the N envs gathered), and OpenEnv's server with
  one ``EnvClient`` (one WebSocket) per session, gathered.
- **latency**: one session's ``BlockingVectorEnv.step`` against a bare asyncio
  TCP round trip of 16 bytes (an echo server), and OpenEnv's one-session step.
- **sessions**: N sessions of an env whose step waits ``--wait`` seconds
  (OpenEnv's scaling harness: 1 s) on one server process: the vector step's
  p50 and p99, the server's CPU per session-step, and its memory per session
  (RSS growth from opening them, beyond as many env objects built bare).
  OpenEnv at ``--openenv-sessions`` (each session a WebSocket of its own).
- **faults**: N sessions stepped ``--fault-steps`` times by the await API,
  the connection cut at random moments (mid-step), and from time to time some
  envs made slower than ``step_timeout`` (their steps time out; the vector env
  is reset and goes on).  Each env counts its steps and returns the action it
  was given, so a reply of another step, a step run twice and a step lost all
  show; the counts must be 0.
- **resume**: a step right after the connection was cut (the reconnect, the
  handshake, the resume and the step) against a fresh connection's handshake
  plus a step.

``--quick`` (CI's smoke test) makes every part a few seconds long.
``--openenv-python`` names an interpreter with ``openenv-core`` installed
(default: this one if it has it); without one, OpenEnv's figures are left out
and the table says why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

try:
    import aiohttp
    import msgspec
    from aiohttp import web
except ModuleNotFoundError as exc:  # pragma: no cover
    print(f'benchmarks/serve.py needs the "serve" extra ({exc.name}): pip install "aiovec[serve]"')
    raise SystemExit(0) from None

import gymnasium

import aiovec
from aiovec._serve import wsclient
from aiovec.testing import TrivialEnv

HERE = os.path.dirname(os.path.abspath(__file__))
TCK = os.sysconf("SC_CLK_TCK")
SLOW = 1 << 29  # an action with this bit set makes CountingEnv's step wait 1 s


class CountingEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """Its observation is ``[session id, steps so far]``; its reward the action's low bits.

    A step waits ``wait`` seconds (1 s when the action has the `SLOW` bit), and
    counts only once it has waited: a step cancelled meanwhile is not counted.
    """

    observation_space = gymnasium.spaces.Box(0, 2**31, (2,), np.int64)
    action_space = gymnasium.spaces.Discrete(2**30)

    def __init__(self, wait: float = 0.0) -> None:
        self.wait, self.steps, self.id = wait, 0, 0

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        await super().reset(seed=seed)
        self.id = int(seed or 0)
        return np.array([self.id, self.steps], np.int64), {}

    async def step(self, action: Any) -> Any:
        action = int(action)
        wait = 1.0 if action & SLOW else self.wait
        if wait:
            await asyncio.sleep(wait)
        self.steps += 1
        return np.array([self.id, self.steps], np.int64), float(action & ~SLOW), False, False, {}


# --------------------------------------------------------------------------- processes


class Process:
    """A helper process that prints its address on its first line; stopped on exit."""

    def __init__(self, command: list[str], **kwargs: Any) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
        }
        self.popen = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, **kwargs
        )
        assert self.popen.stdout is not None
        self.line = self.popen.stdout.readline().strip()
        if not self.line:
            self.stop()
            raise RuntimeError(f"{command} did not start")

    @property
    def address(self) -> str:
        return self.line.split()[-1]

    def cpu(self) -> float:
        """User + system seconds of the process so far."""
        with open(f"/proc/{self.popen.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / TCK

    def rss(self) -> int:
        """Resident memory, bytes."""
        with open(f"/proc/{self.popen.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@contextlib.contextmanager
def running(command: list[str]) -> Iterator[Process]:
    process = Process(command)
    try:
        yield process
    finally:
        process.stop()


def aiovec_server(factory: str = "aiovec.testing:TrivialEnv") -> list[str]:
    return [sys.executable, "-m", "aiovec", "serve", factory, "--port", "0"]


def helper(kind: str) -> list[str]:
    return [sys.executable, __file__, "--helper", kind]


class OpenEnv:
    """OpenEnv's side (``_serve_openenv.py``) under an interpreter that has openenv-core."""

    def __init__(self, python: str | None) -> None:
        self.python = python
        self.why = ""
        if python is None:
            self.why = (
                "openenv-core is not installed here; give --openenv-python PATH (an "
                "interpreter that has it)"
            )

    def server(self, wait: float, sessions: int) -> list[str]:
        assert self.python is not None
        script = os.path.join(HERE, "_serve_openenv.py")
        return [self.python, script, "server", "--wait", str(wait), "--sessions", str(sessions)]

    def run(self, command: str, port: str, **args: Any) -> dict[str, Any]:
        assert self.python is not None
        flags = [f"--{k}={v}" for k, v in args.items()]
        script = os.path.join(HERE, "_serve_openenv.py")
        done = subprocess.run(
            [self.python, script, command, f"--port={port}", *flags],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"OpenEnv's {command} failed: {done.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result


def find_openenv(given: str | None) -> str | None:
    if given:
        return given
    if importlib.util.find_spec("openenv") is not None:
        return sys.executable
    return None


# --------------------------------------------------------------------------- baselines


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:
            writer.write(await reader.readexactly(16))


def echo_main() -> None:
    """A bare asyncio TCP echo server (a process of its own): prints its port."""

    async def main() -> None:
        server = await asyncio.start_server(_echo, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def aiohttp_main() -> None:
    """A one-frame-per-step aiohttp WebSocket server of TrivialEnvs: prints its port."""
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()

    async def handle(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        envs: dict[int, TrivialEnv] = {}
        async for msg in ws:
            env_id, action = decoder.decode(msg.data)
            env = envs.get(env_id) or envs.setdefault(env_id, TrivialEnv())
            obs, reward, term, trunc, _ = env.step(action)
            await ws.send_bytes(encoder.encode([env_id, obs.tobytes(), reward, term, trunc]))
        return ws

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


async def _frame_per_step(port: str, num_envs: int, steps: int) -> float:
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"ws://127.0.0.1:{port}/") as ws,
    ):
        waiting: dict[int, asyncio.Future[Any]] = {}

        async def reader() -> None:
            async for msg in ws:
                waiting.pop(decoder.decode(msg.data)[0]).set_result(None)

        task = asyncio.ensure_future(reader())
        loop = asyncio.get_running_loop()

        async def one(env_id: int) -> None:
            waiting[env_id] = loop.create_future()
            await ws.send_bytes(encoder.encode([env_id, 0]))
            await waiting[env_id]

        started = time.perf_counter()
        for _ in range(steps):
            await asyncio.gather(*(one(i) for i in range(num_envs)))
        elapsed = time.perf_counter() - started
        task.cancel()
        return num_envs * steps / elapsed


async def _echo_rtt(port: str, steps: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
    message = bytes(16)
    for _ in range(100):
        writer.write(message)
        await reader.readexactly(16)
    started = time.perf_counter()
    for _ in range(steps):
        writer.write(message)
        await reader.readexactly(16)
    elapsed = time.perf_counter() - started
    writer.close()
    await writer.wait_closed()
    return 1e6 * elapsed / steps


# --------------------------------------------------------------------------- parts


class Table:
    """Rows of ``(what, ours, baseline, target)`` printed at the end, as markdown."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, what: str, ours: str, baseline: str = "", target: str = "") -> None:
        self.rows.append((what, ours, baseline, target))
        print(f"  {what}: {ours}" + (f" | {baseline}" if baseline else ""), flush=True)

    def show(self) -> None:
        print("\n| part | aiovec serve | baseline | target |\n|---|---|---|---|")
        for row in self.rows:
            print("| " + " | ".join(row) + " |")


def spread(values: list[float], fmt: str = ",.0f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def _timed(server: Process, fn: Callable[[], int]) -> tuple[float, float, float]:
    """``(env-steps/s, client CPU us, server CPU us)`` per env-step of ``fn`` (its env-steps)."""
    cpu, server_cpu, started = time.process_time(), server.cpu(), time.perf_counter()
    count = fn()
    elapsed = time.perf_counter() - started
    cpu, server_cpu = time.process_time() - cpu, server.cpu() - server_cpu
    return count / elapsed, 1e6 * cpu / count, 1e6 * server_cpu / count


def _lock_step(venv: Any, num_envs: int, steps: int) -> Callable[[], int]:
    actions = np.zeros(num_envs, np.int64)

    def run() -> int:
        for _ in range(steps):
            venv.step(actions)
        return num_envs * steps

    return run


def _pipelined(venv: Any, num_envs: int, steps: int) -> Callable[[], int]:
    """Two halves in flight; each ``recv`` takes what finished and sends it again."""
    half = num_envs // 2
    zeros = np.zeros(num_envs, np.int64)

    def run() -> int:
        venv.send(zeros[:half], list(range(half)))
        venv.send(zeros[half:], list(range(half, num_envs)))
        done = 0
        while done < num_envs * steps:
            ids = venv.recv(min_envs=half)[5]
            done += len(ids)
            venv.send(zeros[: len(ids)], ids)
        return done + len(venv.recv(min_envs=num_envs)[5])  # every env was in flight

    return run


def throughput(args: argparse.Namespace, openenv: OpenEnv, table: Table) -> None:
    """Trivial steps/s over one connection: lock-step, pipelined, and the baselines."""
    n, steps, repeats = args.num_envs, args.steps, args.repeats
    print(f"\nthroughput: trivial env-steps/s over one connection, {n} sessions", flush=True)
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[tuple[float, float]]] = {}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(running(aiovec_server()))
        frames = stack.enter_context(running(helper("aiohttp")))
        venv = stack.enter_context(aiovec.make(server.address, n))
        oe = None
        if openenv.python:
            oe = stack.enter_context(running(openenv.server(0.0, n)))
        venv.reset(seed=0)
        for _ in range(3):
            venv.step(np.zeros(n, np.int64))
        for _ in range(repeats):
            for name, make in (("lock-step", _lock_step), ("pipelined", _pipelined)):
                rate, client, served = _timed(server, make(venv, n, steps))
                rates.setdefault(name, []).append(rate)
                cpus.setdefault(name, []).append((client, served))
            rates.setdefault("aiohttp", []).append(
                asyncio.run(_frame_per_step(frames.address, n, max(1, steps // 8)))
            )
            if oe is not None:
                got = openenv.run("throughput", oe.address, sessions=n, steps=max(2, steps // 40))
                rates.setdefault("openenv", []).append(got["steps_per_s"])
    for name in ("lock-step", "pipelined"):
        client = statistics.median(c for c, _ in cpus[name])
        served = statistics.median(s for _, s in cpus[name])
        table.add(
            f"trivial env-steps/s, {n} sessions, one connection, {name}",
            f"{spread(rates[name])}; CPU per env-step: client {client:.2f} us, "
            f"server {served:.2f} us",
            f"aiohttp, a frame per env-step: {spread(rates['aiohttp'])}"
            + (f"; OpenEnv, a WebSocket per session: {spread(rates['openenv'])}" if oe else ""),
            ">= 300,000",
        )
    if oe is None:
        table.add("OpenEnv throughput", "not run", openenv.why)


def latency(args: argparse.Namespace, openenv: OpenEnv, table: Table) -> None:
    """One session's step against a bare asyncio TCP round trip (microseconds)."""
    steps, repeats = args.latency_steps, args.repeats
    print("\nlatency: one session's step, microseconds", flush=True)
    ours: list[float] = []
    bare: list[float] = []
    theirs: list[float] = []
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(running(aiovec_server()))
        echo = stack.enter_context(running(helper("echo")))
        venv = stack.enter_context(aiovec.make(server.address, 1))
        oe = stack.enter_context(running(openenv.server(0.0, 4))) if openenv.python else None
        venv.reset(seed=0)
        action = np.zeros(1, np.int64)
        for _ in range(100):
            venv.step(action)
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(steps):
                venv.step(action)
            ours.append(1e6 * (time.perf_counter() - started) / steps)
            bare.append(asyncio.run(_echo_rtt(echo.address, steps)))
            if oe is not None:
                theirs.append(openenv.run("latency", oe.address, steps=max(50, steps // 4))["us"])
    ratios = [o / b for o, b in zip(ours, bare, strict=True)]
    table.add(
        "one session's step, us (BlockingVectorEnv.step)",
        f"{spread(ours)}; {statistics.median(ratios):.2f}x the bare round trip "
        f"({min(ratios):.2f}-{max(ratios):.2f}, paired)",
        f"bare asyncio TCP round trip: {spread(bare)}"
        + (f"; OpenEnv: {spread(theirs)}" if oe else ""),
        "<= 1.5x",
    )


def sessions(args: argparse.Namespace, openenv: OpenEnv, table: Table) -> None:
    """N sessions of an env whose step waits ``wait`` s, on one server process."""
    n, wait, steps = args.sessions, args.wait, args.session_steps
    print(f"\nsessions: {n:,} sessions, each step waits {wait} s, {steps} steps", flush=True)
    with running(aiovec_server("serve:CountingEnv")) as server:
        before = server.rss()
        with aiovec.make(
            server.address, n, wait=wait, backend_options={"connect_timeout": 600}
        ) as venv:
            venv.reset(seed=list(range(n)))
            opened = server.rss()
            venv.step(np.full(n, 1, np.int64))
            times = []
            cpu = server.cpu()
            for k in range(steps):
                started = time.perf_counter()
                venv.step(np.full(n, k + 2, np.int64))
                times.append(time.perf_counter() - started)
            cpu = server.cpu() - cpu
    own = _env_bytes(n)
    p50, p99 = float(np.median(times)), float(np.percentile(times, 99))
    baseline = ""
    if openenv.python:
        m = args.openenv_sessions
        with running(openenv.server(wait, m)) as oe:
            cpu_oe = oe.cpu()
            got = openenv.run("sessions", oe.address, sessions=m, steps=max(2, steps // 2))
            cpu_oe = oe.cpu() - cpu_oe
        per = 1e6 * cpu_oe / (m * (max(2, steps // 2) + 1))
        baseline = (
            f"OpenEnv, {m:,} sessions (a WebSocket each): p99 of a session's step "
            f"{got['p99']:.3f} s, of a round {got['round_p99']:.3f} s; "
            f"server {per:.0f} us CPU per session-step"
        )
    else:
        baseline = f"OpenEnv: not run ({openenv.why})"
    table.add(
        f"{n:,} sessions of a {wait:g} s step, one server process",
        f"vector step p50 {p50:.3f} s, p99 {p99:.3f} s; server {1e6 * cpu / steps / n:.1f} us "
        f"CPU per session-step; {(opened - before) / n - own:,.0f} B per session beyond "
        f"the env's own ({own:,.0f} B)",
        baseline,
        "p99 <= 1.2 s at >= 16,384 sessions; <= 2 KiB per idle session",
    )


def _env_bytes(n: int) -> float:
    """The RSS growth of building ``n`` CountingEnvs bare, per env (a process of its own)."""
    code = (
        f"import os, sys; sys.path.insert(0, {HERE!r})\n"
        "def rss():\n"
        "    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0]"
        ".split()[1]) * 1024\n"
        "import serve, asyncio\n"
        f"before = rss(); envs = [serve.CountingEnv(0.0) for _ in range({n})]\n"
        "async def main():\n"
        "    for i, e in enumerate(envs): await e.reset(seed=i)\n"
        f"asyncio.run(main()); print((rss() - before) / {n})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def faults(args: argparse.Namespace, openenv: OpenEnv, table: Table) -> None:
    """Steps with cuts at random moments and deadlines missed: mismatched, repeated, lost."""
    n, steps = args.fault_envs, args.fault_steps
    rng = random.Random(0)
    counts = {"mismatched": 0, "repeated": 0, "lost": 0, "cuts": 0, "timeouts": 0, "steps": 0}
    print(f"\nfaults: {n} sessions, {steps:,} steps", flush=True)
    with running(aiovec_server("serve:CountingEnv")) as server:

        async def run() -> int:
            async with aiovec.make(server.address, n, blocking=False, step_timeout=0.25) as venv:
                backend = venv._backend
                ids = np.arange(n)
                obs, _ = await venv.reset(seed=list(range(n)))
                expected = obs[:, 1].copy()  # each env's count of steps so far
                for k in range(1, steps + 1):
                    actions = np.full(n, k, np.int64)
                    slow = np.zeros(n, bool)
                    if k % 97 == 0:  # some envs miss the deadline: their steps time out
                        slow[rng.sample(range(n), max(1, n // 64))] = True
                        actions[slow] |= SLOW
                    stepping = asyncio.ensure_future(venv.step(actions))
                    if rng.random() < args.cut_chance:
                        for _ in range(rng.randrange(3)):
                            await asyncio.sleep(0)
                        backend.drop_connection()
                        counts["cuts"] += 1
                    try:
                        obs, rewards, *_ = await stepping
                    except aiovec.EnvTimeoutError as exc:
                        late = list(exc.errors)
                        counts["timeouts"] += len(late)
                        expected += 1  # the others' steps ran; the late ones were cancelled
                        expected[late] -= 1
                        obs, _ = await venv.reset(seed=list(range(n)))
                        _check(obs, ids, expected, None, counts)
                        continue
                    expected += 1
                    _check(obs, ids, expected, (rewards, k), counts)
                    counts["steps"] += n
                return backend.reconnects

        reconnects = asyncio.run(run())
    total = counts["steps"]
    table.add(
        f"faults: {total:,} env-steps, {counts['cuts']} cuts mid-step ({reconnects} resumes), "
        f"{counts['timeouts']} steps past their deadline",
        f"mismatched replies {counts['mismatched']}, steps run twice {counts['repeated']}, "
        f"steps lost {counts['lost']}",
        "",
        "0, 0, 0 in 10^6 steps",
    )
    if counts["mismatched"] or counts["repeated"] or counts["lost"]:
        raise SystemExit("faults: the rollouts were not exact")


def _check(
    obs: np.ndarray,
    ids: np.ndarray,
    expected: np.ndarray,
    rewards: tuple[np.ndarray, int] | None,
    counts: dict[str, int],
) -> None:
    counts["mismatched"] += int((obs[:, 0] != ids).sum())
    if rewards is not None:
        counts["mismatched"] += int((rewards[0] != rewards[1]).sum())
    counts["repeated"] += int((obs[:, 1] > expected).sum())
    counts["lost"] += int((obs[:, 1] < expected).sum())
    expected[:] = obs[:, 1]


def resume(args: argparse.Namespace, openenv: OpenEnv, table: Table) -> None:
    """A step right after a cut, against a fresh connection's handshake plus a step."""
    trials = args.resume_trials
    print(f"\nresume: {trials} cuts", flush=True)
    resumed: list[float] = []
    fresh: list[float] = []
    with running(aiovec_server()) as server:

        async def run() -> None:
            async with aiovec.make(server.address, 8, blocking=False) as venv:
                await venv.reset(seed=0)
                actions = np.zeros(8, np.int64)
                for _ in range(trials):
                    started = time.perf_counter()
                    sock, _ = await wsclient.connect_async(server.address, None, 10.0)
                    sock.close()
                    await venv.step(actions)
                    fresh.append(time.perf_counter() - started)
                    venv._backend.drop_connection()
                    started = time.perf_counter()
                    await venv.step(actions)
                    resumed.append(time.perf_counter() - started)

        asyncio.run(run())
    table.add(
        "a step right after a cut (reconnect, resume, step), ms",
        spread([1e3 * t for t in resumed], ".2f"),
        f"a fresh connection's handshake plus a step: {spread([1e3 * t for t in fresh], '.2f')}",
        "<= the reconnect plus one round trip",
    )


PARTS: dict[str, Callable[[argparse.Namespace, OpenEnv, Table], None]] = {
    "throughput": throughput,
    "latency": latency,
    "sessions": sessions,
    "faults": faults,
    "resume": resume,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds a part (CI)")
    parser.add_argument("--part", choices=list(PARTS), action="append")
    parser.add_argument("--num-envs", type=int, default=256, help="throughput: sessions")
    parser.add_argument("--steps", type=int, default=400, help="throughput: steps a repetition")
    parser.add_argument("--latency-steps", type=int, default=3000)
    parser.add_argument("--sessions", type=int, default=16384, help="sessions: how many")
    parser.add_argument("--openenv-sessions", type=int, default=1024)
    parser.add_argument("--wait", type=float, default=1.0, help="sessions: seconds a step waits")
    parser.add_argument("--session-steps", type=int, default=20)
    parser.add_argument("--fault-envs", type=int, default=256)
    parser.add_argument("--fault-steps", type=int, default=4000)
    parser.add_argument("--cut-chance", type=float, default=0.1, help="faults: cuts per step")
    parser.add_argument("--resume-trials", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--openenv-python", default=None, help="an interpreter with openenv-core")
    parser.add_argument("--helper", choices=["echo", "aiohttp"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.helper:
        {"echo": echo_main, "aiohttp": aiohttp_main}[args.helper]()
        return
    if args.quick:
        args.steps, args.latency_steps, args.repeats = 20, 200, 2
        args.sessions, args.openenv_sessions, args.wait, args.session_steps = 256, 64, 0.05, 3
        args.fault_envs, args.fault_steps, args.resume_trials = 32, 200, 5
    openenv = OpenEnv(find_openenv(args.openenv_python))
    with open("/proc/loadavg") as loadavg:
        load = loadavg.read().split()[0]
    print(
        f"load: {load} (1-minute average) on {os.cpu_count()} CPUs; python {sys.version.split()[0]}"
    )
    table = Table()
    logging.getLogger("aiovec").setLevel(logging.ERROR)  # the cuts' resumes, said once each
    for part in args.part or list(PARTS):
        PARTS[part](args, openenv, table)
    table.show()


if __name__ == "__main__":
    main()
