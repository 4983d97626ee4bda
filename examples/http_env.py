"""Envs over HTTP and WebSocket with aiohttp: a web service as the simulator.

Run it with ``python examples/http_env.py`` after ``pip install "aiovec[http]"``
(a couple of seconds; the server is started here, on 127.0.0.1, nothing to set
up).  ``--quick`` (or ``AIOVEC_EXAMPLES_QUICK=1``, which CI sets) takes fewer
steps.

1. **A web service.**  `serve` starts an aiohttp server on a thread of its own
   (with its own loop: it stands in for a remote machine).  It plays a small
   game, one game per client: walk left or right until you reach the target.
   Each request takes 2 ms of server time.  Two ways in: ``POST /games/{id}``
   with a JSON message (HTTP, one request per call), or ``GET /ws`` (WebSocket,
   one game per connection, one message each way per call).
2. **The envs.**  `HttpEnv` and `WebSocketEnv` share the game's rules
   (`GameEnv`) and differ only in how a message travels (``_ask``).  Each opens
   its ``aiohttp.ClientSession`` in ``__init__``: aiovec calls env factories on the
   event loop that will run the env (both front ends, every backend that runs
   async envs), so the session is bound to the right loop.  The WebSocket
   connects in its first ``reset`` (the inline backend builds envs in the
   constructor, which cannot wait); ``close`` closes the socket and the session.
3. **The await API.**  16 HTTP envs on an ``AsyncioVectorEnv``: each step is 16
   requests in flight at once, not one after the other.
4. **The blocking API.**  8 HTTP and 8 WebSocket envs in one
   ``BlockingVectorEnv``, a drop-in for ``gymnasium.vector.SyncVectorEnv``: no
   ``await`` in sight, and the waits still overlap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
from gymnasium import spaces

import aiovec

try:
    import aiohttp
    from aiohttp import web
except ImportError as exc:  # fail loudly: CI installs the extra and must run this
    hint = 'examples/http_env.py needs aiohttp: pip install "aiovec[http]"'
    raise SystemExit(f"{hint} ({exc})") from exc

NUM_ENVS = 16
LATENCY = 0.002  # seconds of server time per request
MAX_STEPS = 50  # an episode is truncated after this many steps


# --------------------------------------------------------------------------- the service


class Game:
    """The server's game: walk (0 left, 1 right) to a random target in [-1, 1]."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.position = 0.0
        self.target = float(rng.uniform(-1.0, 1.0))

    def observe(self) -> list[float]:
        return [self.position, self.target]

    def step(self, action: int) -> dict[str, Any]:
        self.position = min(1.0, max(-1.0, self.position + (0.1 if action else -0.1)))
        distance = abs(self.position - self.target)
        return {"obs": self.observe(), "reward": -distance, "terminated": distance < 0.05}


async def answer(games: dict[str, Game], key: str, message: dict[str, Any]) -> dict[str, Any]:
    """One request of game ``key``: ``{"op": "reset", "seed": s}`` or ``{"op": "step", ...}``."""
    await asyncio.sleep(LATENCY)  # the server's work
    if message["op"] == "reset":
        games[key] = Game(message["seed"])
        return {"obs": games[key].observe()}
    return games[key].step(int(message["action"]))


def make_app() -> web.Application:
    games: dict[str, Game] = {}

    async def http(request: web.Request) -> web.Response:
        reply = await answer(games, request.match_info["id"], await request.json())
        return web.json_response(reply)

    async def finish(request: web.Request) -> web.Response:
        games.pop(request.match_info["id"], None)
        return web.Response(status=204)

    async def websocket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        key = uuid.uuid4().hex
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await ws.send_json(await answer(games, key, message.json()))
        finally:
            games.pop(key, None)
        return ws

    app = web.Application()
    app.add_routes([web.post("/games/{id}", http), web.delete("/games/{id}", finish)])
    app.add_routes([web.get("/ws", websocket)])
    return app


@contextlib.contextmanager
def serve() -> Iterator[str]:
    """Run the service on 127.0.0.1 (a free port) on a thread of its own; yield its URL."""
    started = threading.Event()
    state: dict[str, Any] = {}

    async def run() -> None:
        runner = web.AppRunner(make_app())
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            state["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
            state["loop"], state["stop"] = asyncio.get_running_loop(), asyncio.Event()
            started.set()
            await state["stop"].wait()
        finally:
            await runner.cleanup()

    def thread_main() -> None:
        try:
            asyncio.run(run())
        finally:
            started.set()  # also when it failed to start

    thread = threading.Thread(target=thread_main, name="http-service")
    thread.start()
    started.wait()
    try:
        if "url" not in state:
            raise RuntimeError("the service failed to start (see the traceback above)")
        yield state["url"]
    finally:
        if "stop" in state:
            state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join()


# --------------------------------------------------------------------------- the envs


class GameEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """The game as an env; subclasses say how a message reaches the service (``_ask``)."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = aiohttp.ClientSession()  # needs the running loop: aiovec gives it one
        self.steps = 0

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        await super().reset(seed=seed)
        self.steps = 0
        game_seed = int(self.np_random.integers(2**31))  # seeded envs play seeded games
        reply = await self._ask({"op": "reset", "seed": game_seed})
        return np.asarray(reply["obs"], np.float32), {}

    async def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reply = await self._ask({"op": "step", "action": int(action)})
        self.steps += 1
        obs = np.asarray(reply["obs"], np.float32)
        return obs, float(reply["reward"]), reply["terminated"], self.steps >= MAX_STEPS, {}

    async def close(self) -> None:
        await self.session.close()


class HttpEnv(GameEnv):
    """One HTTP request per call; the game is named by an id of the env's own."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.game = f"{url}/games/{uuid.uuid4().hex}"

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(self.game, json=message) as response:
            response.raise_for_status()
            reply: dict[str, Any] = await response.json()
            return reply

    async def close(self) -> None:
        with contextlib.suppress(aiohttp.ClientError):  # the service may be gone already
            await self.session.delete(self.game)
        await super().close()


class WebSocketEnv(GameEnv):
    """One WebSocket per env, connected in the first ``reset``; one message each way per call."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.ws is None:
            self.ws = await self.session.ws_connect(f"{self.url}/ws")
        try:
            await self.ws.send_json(message)
            reply: dict[str, Any] = await self.ws.receive_json()
        except BaseException:  # the stream may be out of step: reconnect on the next call
            ws, self.ws = self.ws, None
            await ws.close()
            raise
        return reply

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        await super().close()


# --------------------------------------------------------------------------- the runs


async def with_await(url: str, steps: int) -> None:
    """16 HTTP envs stepped together on this loop."""
    rng = np.random.default_rng(0)
    fns = [functools.partial(HttpEnv, url)] * NUM_ENVS
    async with aiovec.AsyncioVectorEnv(fns, step_timeout=5.0) as venv:  # built on this loop
        await venv.reset(seed=42)
        start = time.perf_counter()
        total = 0.0
        for _ in range(steps):
            _, rewards, *_ = await venv.step(rng.integers(0, 2, NUM_ENVS))
            total += float(rewards.sum())
        elapsed = time.perf_counter() - start
    print(
        f"await, {NUM_ENVS} HTTP envs: {steps} steps in {elapsed:.2f} s "
        f"({steps * NUM_ENVS / elapsed:,.0f} env-steps/s; one at a time would take "
        f"at least {steps * NUM_ENVS * LATENCY:.2f} s), mean reward {total / steps / NUM_ENVS:.3f}"
    )


def with_blocking(url: str, steps: int) -> None:
    """8 HTTP and 8 WebSocket envs in one blocking vector env: no ``await`` here."""
    half = NUM_ENVS // 2
    fns = [functools.partial(HttpEnv, url)] * half + [functools.partial(WebSocketEnv, url)] * half
    with aiovec.BlockingVectorEnv(fns, step_timeout=5.0) as envs:
        envs.reset(seed=42)
        start = time.perf_counter()
        episodes = 0
        for _ in range(steps):
            _, _, terminations, truncations, _ = envs.step(envs.action_space.sample())
            episodes += int((terminations | truncations).sum())
        elapsed = time.perf_counter() - start
    print(
        f"blocking, {half} HTTP + {half} WebSocket envs: {steps} steps in {elapsed:.2f} s, "
        f"{episodes} episodes ended"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="a few steps (CI)")
    args = parser.parse_args()
    steps = 20 if args.quick or os.environ.get("AIOVEC_EXAMPLES_QUICK") == "1" else args.steps
    with serve() as url:
        print(f"service on {url}, {LATENCY * 1e3:.0f} ms per request")
        asyncio.run(with_await(url, steps))
        with_blocking(url, steps)


if __name__ == "__main__":
    main()
