"""``aiovec serve`` against the obvious ways of putting envs behind a network, in one run.

Each part starts its servers as processes of their own (``python -m aiovec serve``
for aiovec), so client and server each have a core of the two, and prints one
table; repetitions are interleaved (candidates in turn) and medians reported
with their range.

- **throughput**: trivial envs (``aiovec.testing.TrivialEnv``) stepped by one
  ``BlockingVectorEnv`` of N sessions on one connection, against a
  one-frame-per-step aiohttp baseline (each env its own request and reply frame
  on one aiohttp WebSocket, the N envs gathered).
- **latency**: one session's step through the whole stack against a bare
  asyncio TCP round trip of a few bytes (an echo server).
- **sessions**: N sessions of an env whose step waits ``--wait`` seconds
  (OpenEnv's scaling harness: 1 s), on a server of one core; the p99 of the
  vector step, and the server's CPU time per session-step.
- **faults**: steps with connections cut at random moments and a per-request
  deadline; each env counts its steps, so a step lost or run twice shows; the
  table counts mismatched replies, repeated and lost steps (all must be 0).

``--quick`` (CI's smoke test) makes every part a few seconds long.  OpenEnv's
``openenv-core`` server is not measured by this script (see benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
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
from aiovec.testing import TrivialEnv

HERE = os.path.dirname(os.path.abspath(__file__))


class CountingEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """Its observation is ``[session id, steps so far]``; a step waits ``wait`` seconds."""

    observation_space = gymnasium.spaces.Box(0, 2**31, (2,), np.int64)
    action_space = gymnasium.spaces.Discrete(2**30)

    def __init__(self, wait: float = 0.0) -> None:
        self.wait, self.steps, self.id = wait, 0, 0

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        await super().reset(seed=seed)
        self.id = int(seed or 0)
        return np.array([self.id, self.steps], np.int64), {}

    async def step(self, action: Any) -> Any:
        if self.wait:
            await asyncio.sleep(self.wait)
        self.steps += 1
        expected = int(action)  # the client sends the step number it expects: a check of order
        return np.array([self.id, self.steps], np.int64), float(expected), False, False, {}


@contextlib.contextmanager
def aiovec_server(factory: str, *extra: str) -> Iterator[str]:
    """``python -m aiovec serve FACTORY`` on a free port; yields its URL."""
    command = [sys.executable, "-m", "aiovec", "serve", factory, "--port", "0", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    ) as process:
        try:
            assert process.stdout is not None
            yield process.stdout.readline().split()[-1]
        finally:
            process.terminate()
            process.wait(30)


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
        print(site._server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


@contextlib.contextmanager
def helper(kind: str) -> Iterator[int]:
    with subprocess.Popen(
        [sys.executable, __file__, "--helper", kind], stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            yield int(process.stdout.readline())
        finally:
            process.terminate()
            process.wait(30)


# --------------------------------------------------------------------------- parts


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def throughput(num_envs: int, steps: int, repeats: int) -> None:
    """Trivial steps/s over one connection: aiovec serve against one frame per step."""
    ours: list[float] = []
    base: list[float] = []
    with (
        aiovec_server("aiovec.testing:TrivialEnv") as url,
        helper("aiohttp") as port,
        aiovec.make(url, num_envs) as venv,
    ):
        if True:
            venv.reset(seed=0)
            actions = np.zeros(num_envs, np.int64)
            for _ in range(repeats):
                started = time.perf_counter()
                for _ in range(steps):
                    venv.step(actions)
                ours.append(num_envs * steps / (time.perf_counter() - started))
                base.append(asyncio.run(_frame_per_step(port, num_envs, max(1, steps // 4))))
    print(f"\nthroughput: trivial env-steps/s over one connection, {num_envs} sessions")
    print(f"  aiovec serve (a frame per vector step): {_spread(ours)}")
    print(f"  aiohttp, a frame per env-step:          {_spread(base)}")
    print(f"  ratio (median): {statistics.median(ours) / statistics.median(base):.1f}x")


async def _frame_per_step(port: int, num_envs: int, steps: int) -> float:
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"ws://127.0.0.1:{port}/") as ws,
    ):
        waiting: dict[int, asyncio.Future[Any]] = {}

        async def reader() -> None:
            async for msg in ws:
                env_id = decoder.decode(msg.data)[0]
                waiting.pop(env_id).set_result(None)

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


def latency(steps: int, repeats: int) -> None:
    """One session's step against a bare asyncio TCP round trip (microseconds)."""
    ours: list[float] = []
    bare: list[float] = []
    with (
        aiovec_server("aiovec.testing:TrivialEnv") as url,
        helper("echo") as port,
        aiovec.make(url, 1) as venv,
    ):
        if True:
            venv.reset(seed=0)
            action = np.zeros(1, np.int64)
            for _ in range(repeats):
                started = time.perf_counter()
                for _ in range(steps):
                    venv.step(action)
                ours.append(1e6 * (time.perf_counter() - started) / steps)
                bare.append(asyncio.run(_echo_rtt(port, steps)))
    print("\nlatency: one session's step, microseconds")
    print(f"  aiovec serve, BlockingVectorEnv step: {_spread(ours)}")
    print(f"  bare asyncio TCP round trip:          {_spread(bare)}")
    print(f"  ratio (median): {statistics.median(ours) / statistics.median(bare):.2f}x")


async def _echo_rtt(port: int, steps: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    message = bytes(16)
    started = time.perf_counter()
    for _ in range(steps):
        writer.write(message)
        await reader.readexactly(16)
    elapsed = time.perf_counter() - started
    writer.close()
    await writer.wait_closed()
    return 1e6 * elapsed / steps


def sessions(num_envs: int, wait: float, steps: int) -> None:
    """N sessions of an env whose step waits ``wait`` s, on one server core."""
    with aiovec_server("serve:CountingEnv", "--resume-window", "60") as url:
        pid = _server_pid(url)
        with aiovec.make(url, num_envs, wait=wait) as venv:
            venv.reset(seed=list(range(num_envs)))
            times = []
            cpu_before = _cpu_seconds(pid)
            for k in range(steps):
                started = time.perf_counter()
                venv.step(np.full(num_envs, k + 1, np.int64))
                times.append(time.perf_counter() - started)
            cpu = _cpu_seconds(pid) - cpu_before
    p99 = float(np.percentile(times, 99))
    print(f"\nsessions: {num_envs} sessions, each step waits {wait} s, {steps} steps")
    print(f"  vector step p50 {np.median(times):.3f} s, p99 {p99:.3f} s")
    print(
        f"  server CPU: {cpu / steps:.3f} s per step "
        f"({1e6 * cpu / steps / num_envs:.2f} us per session-step)"
    )


def _server_pid(url: str) -> int | None:
    port = url.rsplit(":", 1)[1]
    with contextlib.suppress(Exception):
        out = subprocess.run(
            ["ss", "-ltnp", f"sport = :{port}"], capture_output=True, text=True, check=False
        ).stdout
        return int(out.split("pid=")[1].split(",")[0])
    return None


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def faults(num_envs: int, steps: int, cut_every: float) -> None:
    """Steps with cuts at random moments: mismatched replies, repeated and lost steps."""
    rng = random.Random(0)
    mismatched = repeated = lost = cuts = 0
    with aiovec_server("serve:CountingEnv") as url:

        async def run() -> None:
            nonlocal mismatched, repeated, lost, cuts
            async with aiovec.make(url, num_envs, blocking=False, step_timeout=30.0) as venv:
                backend = venv._backend
                obs, _ = await venv.reset(seed=list(range(num_envs)))
                ids = np.arange(num_envs)
                for k in range(1, steps + 1):
                    stepping = asyncio.ensure_future(venv.step(np.full(num_envs, k, np.int64)))
                    if rng.random() < cut_every:
                        for _ in range(rng.randrange(3)):
                            await asyncio.sleep(0)
                        backend.drop_connection()
                        cuts += 1
                    obs, rewards, *_ = await stepping
                    mismatched += int((obs[:, 0] != ids).sum() + (rewards != k).sum())
                    repeated += int((obs[:, 1] > k).sum())
                    lost += int((obs[:, 1] < k).sum())

        asyncio.run(run())
    total = num_envs * steps
    print(f"\nfaults: {total:,} env-steps ({num_envs} sessions), {cuts} connections cut mid-step")
    print(f"  mismatched replies {mismatched}, steps run twice {repeated}, steps lost {lost}")
    if mismatched or repeated or lost:
        raise SystemExit("faults: the rollouts were not exact")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds (CI's smoke test)")
    parser.add_argument(
        "--part", choices=["throughput", "latency", "sessions", "faults"], action="append"
    )
    parser.add_argument("--num-envs", type=int, default=256, help="throughput: sessions")
    parser.add_argument("--sessions", type=int, default=16384, help="sessions: how many")
    parser.add_argument("--wait", type=float, default=1.0, help="sessions: seconds a step waits")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--helper", choices=["echo", "aiohttp"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.helper:
        {"echo": echo_main, "aiohttp": aiohttp_main}[args.helper]()
        return
    parts = args.part or ["throughput", "latency", "sessions", "faults"]
    quick = args.quick
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average) on {os.cpu_count()} CPUs")
    if "throughput" in parts:
        throughput(args.num_envs, 20 if quick else 400, 2 if quick else args.repeats)
    if "latency" in parts:
        latency(100 if quick else 3000, 2 if quick else args.repeats)
    if "sessions" in parts:
        sessions(256 if quick else args.sessions, 0.05 if quick else args.wait, 3 if quick else 20)
    if "faults" in parts:
        faults(64 if quick else 256, 100 if quick else 4000, 0.1)


if __name__ == "__main__":
    main()
