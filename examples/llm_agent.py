"""An LLM-style agent trained GRPO-style: text tasks, groups of 4, an async model server.

The example starts a tiny "model server" on 127.0.0.1 (standard-library
asyncio, HTTP/1.1, JSON; nothing leaves the machine): given a prompt and the
policy's weight ``theta``, it samples a guess after a delay that varies, as a
language model would: with probability ``sigmoid(theta)`` it bisects the
interval the prompt allows, otherwise it guesses at random in it.  Each env is
a number-guessing game whose observations are text ("guess a number from 0 to
15", "7: higher", ...); a task (reset options) fixes the hidden number.

`aiovec.EpisodeCollector` runs each task 4 times (a group, all reset with the
group's seed) on whichever envs are free, the policy's calls in flight
together, and yields groups as they finish; groups whose returns are all equal
carry no signal and are rejected (`aiovec.rewards_differ`), handed back in
each batch's ``discarded``.  The tasks are a stream that never runs out: the
more groups are rejected, the more tasks a batch takes.  The learner is
GRPO's in one parameter: each episode's advantage is its return against its
group's mean, and ``theta`` climbs the policy gradient of the sampled choices.

Run: ``python examples/llm_agent.py`` (``AIOVEC_EXAMPLES_QUICK=1``: a few seconds).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
from gymnasium import spaces

import aiovec

QUICK = os.environ.get("AIOVEC_EXAMPLES_QUICK") == "1"
TOP = 64
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
        if options and "target" in options:  # the task
            self.target = int(options["target"])
        return f"guess a number from 0 to {TOP - 1}", {}

    async def step(self, action: Any) -> Any:
        self.tries += 1
        guess = int(action)
        if guess == self.target:
            return "correct", 1.0, True, False, {}
        hint = "higher" if guess < self.target else "lower"
        return f"{guess}: {hint}", -0.1, False, self.tries >= 7, {}


# -- the "model server" -------------------------------------------------------------


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def sample(request: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The "model": bisect with probability sigmoid(theta), else guess at random."""
    low, high = request["low"], request["high"]
    bisect = rng.random() < sigmoid(request["theta"])
    guess = (low + high) // 2 if bisect else rng.randint(low, max(low, high))
    return {"guess": guess, "bisect": bisect}


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One HTTP/1.1 connection: POST /generate {prompt, low, high, theta} -> {guess, bisect}."""
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
            body = json.dumps(sample(request, random.Random())).encode()
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
    """The async policy: keeps each env's search interval and asks the server.

    Its extras record, per step, whether the model bisected: the sampled choice
    whose log-probability the learner differentiates.
    """

    def __init__(self, client: Client, num_envs: int) -> None:
        self.client = client
        self.theta = -1.0  # the policy's one weight: at first it bisects 27% of the time
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
        self.bounds[env_id] = (min(low, high), max(low, high))

    async def __call__(self, obs: Any, env_ids: np.ndarray) -> Any:
        ids = env_ids.tolist()
        for text, i in zip(obs, ids, strict=True):
            self.read(i, str(text))
        answers = await asyncio.gather(
            *(
                self.client.generate(
                    i,
                    {
                        "prompt": str(t),
                        "low": self.bounds[i][0],
                        "high": self.bounds[i][1],
                        "theta": self.theta,
                    },
                )
                for t, i in zip(obs, ids, strict=True)
            )
        )
        guesses = np.array([a["guess"] for a in answers], np.int64)
        for i, g in zip(ids, guesses.tolist(), strict=True):
            self.last[i] = g
        return guesses, {"bisect": np.array([a["bisect"] for a in answers], np.float64)}

    def learn(self, groups: list[list[aiovec.Episode]], lr: float = 4.0) -> None:
        """GRPO in one weight: group-relative advantages times the choices' score."""
        p = sigmoid(self.theta)
        grad, count = 0.0, 0
        for group in groups:
            returns = np.array([e.rewards.sum() for e in group])
            advantages = (returns - returns.mean()) / (returns.std() + 1e-6)
            for episode, advantage in zip(group, advantages, strict=True):
                bisect = episode.extras["bisect"]
                grad += advantage * float(np.sum(bisect - p))  # d log pi / d theta, summed
                count += len(episode)
        self.theta += lr * grad / max(1, count)


def tasks_forever(seed: int) -> Iterator[dict[str, Any]]:
    """A stream of tasks that cannot run out, however many groups are rejected."""
    rng = random.Random(seed)
    while True:
        yield {"target": rng.randrange(TOP)}


async def main() -> None:
    num_envs, batches = (4, 6) if QUICK else (16, 40)
    group_size, batch_size = 4, 2 if QUICK else 4
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Client(port)
    agent = Agent(client, num_envs)
    venv = aiovec.AsyncioVectorEnv([GuessEnv] * num_envs)
    solved: list[float] = []
    easy = hard = 0  # rejected groups: every member solved its task, or none did
    try:
        async with aiovec.EpisodeCollector(
            venv,
            agent,
            batch_size=batch_size,
            group_size=group_size,
            tasks=tasks_forever(0),
            accept_group=aiovec.rewards_differ,
            max_policy_calls=None,  # the server serves each env's request as it comes
            seed=0,
        ) as collector:
            async for batch in collector:
                for group in batch.discarded:  # rejected: what each task came to
                    easy += all(e.terminated for e in group.episodes)
                    hard += not any(e.terminated for e in group.episodes)
                solved.append(float(np.mean([e.terminated for e in batch.episodes])))
                agent.learn(batch.groups)
                collector.update_policy()
                if len(solved) == batches:
                    break
            rejected = collector.rejected
    finally:
        await venv.close()
        await client.close()
        await asyncio.gather(*HANDLERS)  # each ends at its client's EOF
        server.close()
        await server.wait_closed()
    third = max(1, len(solved) // 3)
    print(
        f"{len(solved)} batches of {batch_size} groups of {group_size} ({rejected} groups "
        f"rejected: all returns equal; {easy} solved by every member, {hard} by none); "
        f"solved {np.mean(solved[:third]):.0%} of episodes at "
        f"first, {np.mean(solved[-third:]):.0%} at the end; P(bisect) = {sigmoid(agent.theta):.2f}"
    )
    assert len(solved) == batches
    if not QUICK:
        assert agent.theta > -1.0, "GRPO should learn to bisect"


if __name__ == "__main__":
    asyncio.run(main())
