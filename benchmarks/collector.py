"""The collector (partial stepping) against lock-step ``step()`` and hand-written loops.

Run from the repository root::

    python benchmarks/collector.py            # every case, a few minutes
    python benchmarks/collector.py --quick    # CI smoke test, a few seconds (rough numbers)

Cases (issue 26's speed targets; figures in docs/collector.md):

``heavy``
    256 async envs on the inline backend whose every step waits a time with a
    heavy tail: 95% uniform in 2-10 ms, 5% in 100-300 ms (seeded per env).
    ``aiovec.Collector`` with a policy returning zeros, against the bound
    (256 / the mean latency), lock-step ``step()`` and a hand-written
    ``send``/``recv(min_envs=1)`` loop over the same envs.
``trivial``
    256 async envs whose step is ``await asyncio.sleep(0)``: the collector's
    time per env-step against a hand-written ``send``/``recv(min_envs=1)`` loop
    (zeros for actions, nothing stored) over the same envs.
``process``
    CartPole, 64 envs, ``backend="process"`` with 2 workers: the collector
    against lock-step ``step()``.
``servers``
    32 async envs stepping in 2-10 ms and an ``async def`` policy calling one
    of two model servers: ``serial`` serves one batched call at a time (20 ms
    whatever its size, a GPU forward pass); ``batching`` takes one request
    per env and answers each in 20 ms however many are in flight (a
    continuous-batching LLM server).  Transitions per second of the default
    settings against every setting of ``max_policy_calls`` x ``max_wait``
    tried; the best is named.
``delay``
    The time from a policy's answer to its env's step (p50, p90), 32 envs
    stepping in 2-10 ms and a policy that awaits 5-30 ms.
``close``
    ``await collector.aclose()`` from another task than the consumer, at a
    random moment: how long it takes (median, max), 16 envs stepping in 2-10 ms
    and a policy that awaits 5-30 ms, on inline and process, both collectors.

Each candidate runs for a fixed time once per repetition, the order rotating;
reported: medians of env-steps per second.  The machine's load is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

import aiovec


class HeavyTailEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """A remote env: each step waits 2-10 ms (95%) or 100-300 ms (5%)."""

    def __init__(self, seed: int, *, trivial: bool = False) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._delays = random.Random(seed)
        self._trivial = trivial
        self._obs = np.zeros(4, np.float32)

    async def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return self._obs, {}

    async def step(self, action: Any) -> Any:
        if self._trivial:
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(heavy_tail(self._delays))
        return self._obs, 1.0, False, False, {}


def heavy_tail(rng: random.Random) -> float:
    """Seconds of one step: 95% in 2-10 ms, 5% in 100-300 ms (mean 15.7 ms)."""
    return rng.uniform(0.1, 0.3) if rng.random() < 0.05 else rng.uniform(0.002, 0.010)


MEAN_LATENCY = 0.95 * 0.006 + 0.05 * 0.2


def zeros(obs: Any, env_ids: np.ndarray) -> np.ndarray:
    return np.zeros(len(env_ids), np.int64)


async def collector_rate(
    venv: Any, seconds: float, policy: Callable[..., Any] = zeros, **kwargs: Any
) -> float:
    kwargs.setdefault("segment_length", 16)
    kwargs.setdefault("batch_size", max(1, venv.num_envs // 4))
    steps, start = -1, 0.0
    async with aiovec.Collector(venv, policy, seed=0, **kwargs) as collector:
        async for batch in collector:
            if steps < 0:  # from the first batch on: in steady state, the steps of the
                steps, start = 0, time.perf_counter()  # segments in progress at the start
                continue  # and at the end (uncounted) are alike
            steps += batch.rewards.size
            if time.perf_counter() - start > seconds:
                break
        return steps / (time.perf_counter() - start)


async def lockstep_rate(venv: Any, seconds: float) -> float:
    await venv.reset(seed=0)
    actions = np.zeros(venv.num_envs, np.int64)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        await venv.step(actions)
        steps += venv.num_envs
    return steps / (time.perf_counter() - start)


async def send_recv_rate(venv: Any, seconds: float) -> float:
    """The hand-written loop: resend every env received, zeros for actions."""
    await venv.reset(seed=0)
    venv.send(np.zeros(venv.num_envs, np.int64))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        *_, ids = await venv.recv(min_envs=1)
        steps += len(ids)
        venv.send(zeros(None, ids), ids)
    rate = steps / (time.perf_counter() - start)
    await venv.recv()
    return rate


Candidate = Callable[[Any, float], Awaitable[float]]


async def measure(
    make: Callable[[], Any], candidates: dict[str, Candidate], reps: int, seconds: float
) -> dict[str, float]:
    rates: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            venv = await make()
            try:
                rates[name].append(await candidates[name](venv, seconds))
            finally:
                await venv.close()
    return {name: statistics.median(r) for name, r in rates.items()}


class SteppingEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """Each step waits 2-10 ms; ``stamps`` (when given) gets the time each step starts."""

    def __init__(self, seed: int, stamps: list[float] | None = None) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._delays = random.Random(seed)
        self._obs = np.zeros(4, np.float32)
        self._stamps = stamps

    async def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return self._obs, {}

    async def step(self, action: Any) -> Any:
        if self._stamps is not None:
            self._stamps.append(time.perf_counter())
        await asyncio.sleep(self._delays.uniform(0.002, 0.010))
        return self._obs, 1.0, False, False, {}


class SerialServer:
    """Serves one batched call at a time: 20 ms a call, whatever its size."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.calls = self.rows = 0

    async def __call__(self, obs: Any, env_ids: np.ndarray) -> np.ndarray:
        async with self._lock:
            await asyncio.sleep(0.020)
        self.calls += 1
        self.rows += len(env_ids)
        return np.zeros(len(env_ids), np.int64)


class BatchingServer(SerialServer):
    """One request per env, each answered in 20 ms however many are in flight."""

    async def __call__(self, obs: Any, env_ids: np.ndarray) -> np.ndarray:
        await asyncio.gather(*(asyncio.sleep(0.020) for _ in env_ids))
        self.calls += 1
        self.rows += len(env_ids)
        return np.zeros(len(env_ids), np.int64)


SETTINGS: list[dict[str, Any]] = [
    {"max_policy_calls": calls, "max_wait": wait}
    for calls in (1, 2, 4, None)
    for wait in (0.0, 0.002, 0.005)
]


def label(setting: dict[str, Any]) -> str:
    return f"max_policy_calls={setting['max_policy_calls']}, max_wait={setting['max_wait']}"


async def servers(reps: int, seconds: float, n: int) -> None:
    """Transitions/s with each server shape: the defaults against every setting tried."""
    for name, server_cls in (("serial", SerialServer), ("batching", BatchingServer)):
        rates: dict[str, list[float]] = {label(s): [] for s in SETTINGS}
        rates["defaults"] = []
        batch: dict[str, list[float]] = {k: [] for k in rates}
        for rep in range(reps):
            order = [*SETTINGS, {}]
            order = order[rep % len(order) :] + order[: rep % len(order)]
            for setting in order:
                key = label(setting) if setting else "defaults"
                server = server_cls()
                fns = [lambda i=i: SteppingEnv(i) for i in range(n)]
                async with aiovec.AsyncioVectorEnv(fns) as venv:
                    rate = await collector_rate(
                        venv, seconds, policy=server, segment_length=8, **setting
                    )
                rates[key].append(rate)
                batch[key].append(server.rows / max(1, server.calls))
        got = {k: statistics.median(v) for k, v in rates.items()}
        best = max((k for k in got if k != "defaults"), key=got.__getitem__)
        print(
            f"{name} server, {n} envs: defaults {got['defaults']:,.0f} transitions/s "
            f"(mean batch {statistics.median(batch['defaults']):.1f}), best {best}: "
            f"{got[best]:,.0f} (mean batch {statistics.median(batch[best]):.1f}); "
            f"defaults/best {got['defaults'] / got[best]:.2f}"
        )
        for key in rates:
            print(f"    {key}: {got[key]:,.0f} (batch {statistics.median(batch[key]):.1f})")


async def answer_delay(seconds: float, n: int) -> tuple[float, float]:
    """From a policy's answer to its env's step: p50 and p90, in ms.

    Envs never end, so env ``i``'s k-th step follows its k-th policy answer.
    """
    rng = random.Random(0)
    answered: list[list[float]] = [[] for _ in range(n)]
    stepped: list[list[float]] = [[] for _ in range(n)]

    async def policy(obs: Any, env_ids: np.ndarray) -> np.ndarray:
        await asyncio.sleep(rng.uniform(0.005, 0.030))
        now = time.perf_counter()
        for i in env_ids.tolist():
            answered[i].append(now)
        return np.zeros(len(env_ids), np.int64)

    fns = [lambda i=i: SteppingEnv(i, stepped[i]) for i in range(n)]
    async with aiovec.AsyncioVectorEnv(fns) as venv:
        await collector_rate(venv, seconds, policy=policy, segment_length=8)
    delays = [
        (step - answer) * 1e3
        for answers, steps in zip(answered, stepped, strict=True)
        for answer, step in zip(answers, steps, strict=False)
    ]
    p50, p90 = np.percentile(delays, [50, 90])
    return float(p50), float(p90)


async def close_times(backend: str, kind: str, tries: int) -> list[float]:
    """Seconds each ``aclose()`` from another task took, closing at a random moment."""
    rng = random.Random(0)

    async def policy(obs: Any, env_ids: np.ndarray) -> np.ndarray:
        await asyncio.sleep(rng.uniform(0.005, 0.030))
        return np.zeros(len(env_ids), np.int64)

    took: list[float] = []
    fns = [lambda i=i: SteppingEnv(i) for i in range(16)]
    async with aiovec.AsyncioVectorEnv(fns, backend=backend, num_workers=2) as venv:
        for _ in range(tries):
            if kind == "Collector":
                collector: Any = aiovec.Collector(venv, policy, segment_length=8, batch_size=4)
            else:
                tasks = itertools.repeat({})
                collector = aiovec.EpisodeCollector(venv, policy, batch_size=2, tasks=tasks)

            async def consume(collector: Any = collector) -> None:
                async for _ in collector:
                    pass

            consumer = asyncio.ensure_future(consume())
            await asyncio.sleep(rng.uniform(0.0, 0.1))
            start = time.perf_counter()
            await collector.aclose()
            took.append(time.perf_counter() - start)
            await consumer  # its loop ended as if the collection were over
            await venv.reset()
    return took


async def closing(tries: int) -> None:
    for backend in ("inline", "process"):
        for kind in ("Collector", "EpisodeCollector"):
            took = await close_times(backend, kind, tries)
            print(
                f"aclose() from another task, {kind} on {backend}, {tries} tries: "
                f"median {statistics.median(took) * 1e3:.1f} ms, max {max(took) * 1e3:.1f} ms"
            )


def heavy_envs(n: int, *, trivial: bool = False) -> Callable[[], Any]:
    async def make() -> Any:
        return aiovec.AsyncioVectorEnv(
            [lambda i=i: HeavyTailEnv(i, trivial=trivial) for i in range(n)]
        )

    return make


def cartpole(n: int) -> Callable[[], Any]:
    async def make() -> Any:
        fns = [lambda: gymnasium.make("CartPole-v1")] * n
        return await aiovec.AsyncioVectorEnv.create(fns, backend="process", num_workers=2)

    return make


async def main(args: argparse.Namespace) -> None:
    quick = args.quick
    reps, seconds = (1, 0.3) if quick else (args.reps, args.seconds)
    n = 64 if quick else 256
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs; reps={reps}, {seconds} s each")
    if "heavy" in args.only:
        candidates = {
            "collector": collector_rate,
            "send/recv": send_recv_rate,
            "step": lockstep_rate,
        }
        got = await measure(heavy_envs(n), candidates, reps, seconds)
        bound = n / MEAN_LATENCY
        print(
            f"heavy-tailed, {n} envs inline: collector {got['collector']:,.0f} env-steps/s "
            f"({got['collector'] / bound:.2f}x the bound {bound:,.0f}), lock-step step() "
            f"{got['step']:,.0f} ({got['collector'] / got['step']:.1f}x), hand-written "
            f"send/recv(min_envs=1) {got['send/recv']:,.0f} ({got['send/recv'] / bound:.2f}x)"
        )
    if "trivial" in args.only:
        got = await measure(
            heavy_envs(n, trivial=True),
            {"collector": collector_rate, "send/recv": send_recv_rate},
            reps,
            seconds,
        )
        cost = got["send/recv"] / got["collector"]
        print(
            f"trivial async, {n} envs: collector {got['collector']:,.0f} env-steps/s, "
            f"hand-written send/recv {got['send/recv']:,.0f}: cost per env-step {cost:.2f}x"
        )
    if "servers" in args.only:
        await servers(reps, seconds, 8 if quick else 32)
    if "delay" in args.only:
        p50, p90 = await answer_delay(seconds * 2, 8 if quick else 32)
        print(f"policy answer -> env step: p50 {p50:.3f} ms, p90 {p90:.3f} ms")
    if "close" in args.only:
        await closing(5 if quick else 100)
    if "process" in args.only:
        m = 8 if quick else 64
        got = await measure(
            cartpole(m), {"collector": collector_rate, "step": lockstep_rate}, reps, seconds
        )
        print(
            f"CartPole, {m} envs, process W=2: collector {got['collector']:,.0f} env-steps/s, "
            f"lock-step step() {got['step']:,.0f} ({got['collector'] / got['step']:.2f}x)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke test: tiny and rough")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument(
        "--only",
        nargs="+",
        default=["heavy", "trivial", "process", "servers", "delay", "close"],
        choices=["heavy", "trivial", "process", "servers", "delay", "close"],
    )
    asyncio.run(main(parser.parse_args()))
