"""OpenEnv's side of ``benchmarks/serve.py``: the same envs behind ``openenv-core``'s server.

Run by an interpreter that has ``openenv-core`` installed (``benchmarks/serve.py
--openenv-python PATH`` starts it; it imports neither aiovec nor numpy).  The
env is the trivial one of ``serve.py`` (a fixed observation of four floats,
reward 1, never ends), whose step optionally waits ``--wait`` seconds
(``step_async``: OpenEnv awaits it on the server's loop, as its scaling guide's
harness does).  The server is OpenEnv's own (``create_app`` under uvicorn);
each session is one ``EnvClient`` (one WebSocket), as OpenEnv's clients are.

    python benchmarks/_serve_openenv.py server [--wait S] [--sessions N]  # prints its port
    python benchmarks/_serve_openenv.py throughput --port P --sessions N --steps K
    python benchmarks/_serve_openenv.py latency --port P --steps K
    python benchmarks/_serve_openenv.py sessions --port P --sessions N --steps K

Each client command prints one line of JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class TrivialAction(Action):
    """One integer."""

    value: int = 0


class TrivialObservation(Observation):
    """Four floats, as aiovec's TrivialEnv's."""

    obs: list[float] = Field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])


class TrivialEnvironment(Environment):
    """Reward 1, never ends; a step waits ``WAIT`` seconds (on the server's loop)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    WAIT = 0.0

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="0", step_count=0)

    def reset(self, seed: int | None = None, **kwargs: Any) -> TrivialObservation:
        return TrivialObservation(done=False, reward=0.0)

    def step(self, action: TrivialAction, **kwargs: Any) -> TrivialObservation:  # type: ignore[override]
        self._state.step_count += 1
        return TrivialObservation(done=False, reward=1.0)

    async def step_async(self, action: TrivialAction, **kwargs: Any) -> TrivialObservation:  # type: ignore[override]
        if self.WAIT:
            await asyncio.sleep(self.WAIT)
        return self.step(action)

    @property
    def state(self) -> State:
        return self._state


class TrivialClient(EnvClient[TrivialAction, TrivialObservation, State]):
    """OpenEnv's client of the trivial env (one WebSocket per session)."""

    def _step_payload(self, action: TrivialAction) -> dict[str, Any]:
        return {"value": action.value}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TrivialObservation]:
        obs = TrivialObservation(**payload.get("observation", {}))
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload["done"])

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


def serve(wait: float, sessions: int) -> None:
    """OpenEnv's server (uvicorn, one process); prints its port once it listens."""
    import uvicorn

    TrivialEnvironment.WAIT = wait
    app = create_app(
        TrivialEnvironment, TrivialAction, TrivialObservation, max_concurrent_envs=sessions
    )
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", ws_max_queue=64)
    server = uvicorn.Server(config)

    async def main() -> None:
        running = asyncio.ensure_future(server.serve())
        while not server.started:  # noqa: ASYNC110  (uvicorn says so by this flag alone)
            await asyncio.sleep(0.05)
        print(server.servers[0].sockets[0].getsockname()[1], flush=True)
        await running

    asyncio.run(main())


async def _clients(port: int, count: int) -> list[TrivialClient]:
    clients = [TrivialClient(f"ws://127.0.0.1:{port}", message_timeout_s=600) for _ in range(count)]
    for start in range(0, count, 256):  # connect in batches: a burst of thousands is refused
        await asyncio.gather(*(c.connect() for c in clients[start : start + 256]))
    await asyncio.gather(*(c.reset() for c in clients))
    return clients


async def _close(clients: list[TrivialClient]) -> None:
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


async def throughput(port: int, sessions: int, steps: int) -> dict[str, Any]:
    """Env-steps/s of ``sessions`` sessions stepped together (``gather``), a frame per env-step."""
    clients = await _clients(port, sessions)
    action = TrivialAction(value=0)
    for _ in range(3):
        await asyncio.gather(*(c.step(action) for c in clients))
    cpu, started = time.process_time(), time.perf_counter()
    for _ in range(steps):
        await asyncio.gather(*(c.step(action) for c in clients))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    await _close(clients)
    return {"steps_per_s": sessions * steps / elapsed, "client_us": 1e6 * cpu / sessions / steps}


async def latency(port: int, steps: int) -> dict[str, Any]:
    """One session's step, microseconds."""
    (client,) = await _clients(port, 1)
    action = TrivialAction(value=0)
    for _ in range(100):
        await client.step(action)
    started = time.perf_counter()
    for _ in range(steps):
        await client.step(action)
    elapsed = time.perf_counter() - started
    await _close([client])
    return {"us": 1e6 * elapsed / steps}


async def sessions_(port: int, sessions: int, steps: int) -> dict[str, Any]:
    """Each session's step latency (seconds) over ``steps`` rounds of all sessions stepping."""
    clients = await _clients(port, sessions)
    action = TrivialAction(value=0)
    times: list[float] = []

    async def one(client: TrivialClient) -> None:
        started = time.perf_counter()
        await client.step(action)
        times.append(time.perf_counter() - started)

    await asyncio.gather(*(one(c) for c in clients))  # a warm-up round
    times.clear()
    rounds: list[float] = []
    for _ in range(steps):
        started = time.perf_counter()
        await asyncio.gather(*(one(c) for c in clients))
        rounds.append(time.perf_counter() - started)
    await _close(clients)
    times.sort()
    return {
        "p50": statistics.median(times),
        "p99": times[int(0.99 * (len(times) - 1))],
        "round_p99": sorted(rounds)[int(0.99 * (len(rounds) - 1))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["server", "throughput", "latency", "sessions"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--wait", type=float, default=0.0)
    args = parser.parse_args()
    if args.command == "server":
        serve(args.wait, args.sessions)
        return
    runs = {
        "throughput": lambda: throughput(args.port, args.sessions, args.steps),
        "latency": lambda: latency(args.port, args.steps),
        "sessions": lambda: sessions_(args.port, args.sessions, args.steps),
    }
    print(json.dumps(asyncio.run(runs[args.command]())), flush=True)


if __name__ == "__main__":
    main()
