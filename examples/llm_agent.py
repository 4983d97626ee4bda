"""An LLM-style agent: text observations, an async policy that asks an HTTP server.

The example starts a tiny "inference server" on 127.0.0.1 (standard-library
asyncio, HTTP/1.1, JSON): given a prompt, it answers a guess after a delay that
varies, as a language model would.  Each env is a number-guessing game whose
observations are text ("guess a number from 0 to 15", "higher", "lower").  The
policy is an ``async def`` that sends every ready env's prompt to the server
concurrently; `aiovec.Collector` keeps several such calls in flight and steps
each env as soon as its answer is back, then hands out trajectory segments.

Run: ``python examples/llm_agent.py`` (``AIOVEC_EXAMPLES_QUICK=1``: a few seconds).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any

import numpy as np
from gymnasium import spaces

import aiovec

QUICK = os.environ.get("AIOVEC_EXAMPLES_QUICK") == "1"
TOP = 16
HANDLERS: set[asyncio.Task[Any]] = set()  # the server's connections, awaited at the end


class GuessEnv(aiovec.AsyncEnv[str, np.int64]):
    """Guess a hidden number; the observation says "higher" or "lower"."""

    observation_space = spaces.Text(max_length=64)
    action_space = spaces.Discrete(TOP)

    def __init__(self) -> None:
        self.target = 0
        self.tries = 0

    async def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        await super().reset(seed=seed)
        self.target, self.tries = int(self.np_random.integers(TOP)), 0
        return f"guess a number from 0 to {TOP - 1}", {}

    async def step(self, action: Any) -> Any:
        self.tries += 1
        guess = int(action)
        if guess == self.target:
            return "correct", 1.0, True, False, {}
        hint = "higher" if guess < self.target else "lower"
        return f"{guess}: {hint}", -0.1, False, self.tries >= 8, {}


# -- the "inference server" ---------------------------------------------------------


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One HTTP/1.1 connection: POST /generate {"prompt", "low", "high"} -> {"guess"}."""
    HANDLERS.add(asyncio.current_task())  # type: ignore[arg-type]
    try:
        while header := await reader.readuntil(b"\r\n\r\n"):
            length = int(
                next(
                    line.split(b":")[1]
                    for line in header.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            request = json.loads(await reader.readexactly(length))
            await asyncio.sleep(random.uniform(0.001, 0.02))  # "generation" takes a while
            body = json.dumps({"guess": (request["low"] + request["high"]) // 2}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


class Client:
    """A keep-alive HTTP client: one connection per env (stdlib only)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conns: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def generate(self, env_id: int, request: dict[str, Any]) -> dict[str, Any]:
        if env_id not in self.conns:
            self.conns[env_id] = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.conns[env_id]
        body = json.dumps(request).encode()
        writer.write(
            b"POST /generate HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        header = await reader.readuntil(b"\r\n\r\n")
        length = int(header.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return json.loads(await reader.readexactly(length))

    async def close(self) -> None:
        for _, writer in self.conns.values():
            writer.close()
            await writer.wait_closed()


class Agent:
    """The async policy: keeps each env's search interval and asks the server."""

    def __init__(self, client: Client, num_envs: int) -> None:
        self.client = client
        self.bounds = [(0, TOP - 1)] * num_envs
        self.last = [0] * num_envs

    def read(self, env_id: int, text: str) -> None:
        low, high = self.bounds[env_id]
        if text.startswith("guess"):
            low, high = 0, TOP - 1
        elif text.endswith("higher"):
            low = self.last[env_id] + 1
        elif text.endswith("lower"):
            high = self.last[env_id] - 1
        self.bounds[env_id] = (low, high)

    async def __call__(self, obs: Any, env_ids: np.ndarray) -> Any:
        for text, i in zip(obs, env_ids.tolist(), strict=True):
            self.read(i, str(text))
        answers = await asyncio.gather(
            *(
                self.client.generate(
                    i, {"prompt": str(t), "low": self.bounds[i][0], "high": self.bounds[i][1]}
                )
                for t, i in zip(obs, env_ids.tolist(), strict=True)
            )
        )
        guesses = np.array([a["guess"] for a in answers], np.int64)
        for i, g in zip(env_ids.tolist(), guesses.tolist(), strict=True):
            self.last[i] = g
        return guesses


async def main() -> None:
    num_envs, batches = (4, 3) if QUICK else (32, 40)
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Client(port)
    venv = aiovec.AsyncioVectorEnv([GuessEnv] * num_envs)
    solved = episodes = 0
    try:
        async with aiovec.Collector(
            venv, Agent(client, num_envs), segment_length=4, batch_size=4, max_batch=4
        ) as collector:
            async for batch in collector:
                ended = batch.terminations | batch.truncations
                episodes += int(ended.sum())
                solved += int(batch.terminations.sum())
                batches -= 1
                if not batches:
                    break
    finally:
        await venv.close()
        await client.close()
        await asyncio.gather(*HANDLERS)  # each ends at its client's EOF
        server.close()
        await server.wait_closed()
    print(f"{episodes} episodes ended, {solved} solved by binary search over HTTP")
    assert solved > 0


if __name__ == "__main__":
    asyncio.run(main())
