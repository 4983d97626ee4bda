"""Network envs with aiovec: timeouts, restarts, a concurrency limit, partial stepping.

Each env here is a client of a game server: every ``reset`` and ``step`` is one
request and one reply over TCP.  This is the shape of any env that talks to a
remote simulator, a game client or a web service, and this script is the way
to run many of them with aiovec.  Run it with ``python examples/network_env.py``
(a few seconds; the server is started here, nothing to set up).

1. **A server.**  ``aiovec.gameserver.GameServer`` plays a small chase game, one
   session per connection, on 127.0.0.1.  It answers each request after 2 ms
   (plus up to 2 ms of seeded jitter), and runs on a thread of its own with its
   own event loop (``start_in_thread()``): it stands in for a remote machine.
2. **The env.**  ``aiovec.gameserver.GameClientEnv`` is an ``aiovec.AsyncEnv``
   written the way a network env should be: it connects lazily, in its first
   ``reset`` (so building envs is free, and a rebuilt env simply reconnects);
   each ``reset``/``step`` is exactly one round trip; any failure in a round
   trip drops the connection, since the stream may be out of step (the next
   ``reset`` reconnects); ``close`` closes the connection.
3. **The vector env.**  ``AsyncioVectorEnv`` over 32 of them, with
   ``step_timeout=1.0`` (an env that has not answered a step within 1 s fails
   with ``aiovec.EnvTimeoutError``; its call is cancelled, so its late reply can
   never leak into a later step), ``reset_timeout=5.0`` (resets connect, so they
   get longer), ``on_error=RestartPolicy(...)`` (a failed env is closed, rebuilt
   from its factory and reset; its row comes back with ``truncated=True``,
   reward 0 and ``infos["error"]``, and the other envs' transitions are kept)
   and ``max_concurrency=16`` (at most 16 requests in flight to the server).
4. **A training loop** with a random policy.  Halfway through, the server drops
   every connection at once (``drop_all()``), as a crashing server would: the
   next step restarts the envs instead of raising, and ``infos["_error"]``
   says which rows were restarted.
5. **Partial stepping.**  ``send(actions, env_ids)`` starts steps and returns;
   ``recv(min_envs=8)`` returns as soon as 8 envs have answered (every env that
   has is included), with ``env_ids`` saying which rows are which.  The policy
   acts on those rows only and sends them off again: a slow env never holds
   the others back.
6. **Latency stats.**  ``latency_stats()``: per-env p50/p99 of the calls that
   waited, and which envs (which connections, which servers) are the slowest
   (time spent queued for a ``max_concurrency`` token is included).
7. **Cleanup.**  ``async with`` closes every env (and its connection); leaving
   the ``with`` block stops the server's thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

import aiovec
from aiovec.gameserver import GameClientEnv, GameServer, ServerThread

NUM_ENVS = 32
STEPS = 200  # full-batch vector steps
DROP_AT = STEPS // 2  # the server drops every connection before this step
PARTIAL_ROUNDS = 40
MIN_ENVS = 8


def policy(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Stand-in for an agent: one random move (0-4) per row of ``obs``."""
    return rng.integers(0, 5, size=len(obs))


async def train(venv: aiovec.AsyncioVectorEnv[Any, Any], server: ServerThread) -> None:
    """Full-batch steps; the server crashes halfway and the envs are restarted."""
    rng = np.random.default_rng(0)
    obs, _infos = await venv.reset(seed=42)  # connects all 32 clients at once
    episodes = restarted = 0
    example_error = ""
    start = time.perf_counter()
    for t in range(STEPS):
        if t == DROP_AT:
            dropped = await asyncio.to_thread(server.drop_all)  # never block the loop
            print(f"step {t}: the server dropped {dropped} connections")
        obs, _rewards, terminations, truncations, infos = await venv.step(policy(obs, rng))
        if "error" in infos:  # restarted envs: truncated, reward 0, the error in info
            rows = np.flatnonzero(infos["_error"])
            restarted += len(rows)
            example_error = str(infos["error"][rows[0]])
            print(f"step {t}: {len(rows)} envs were restarted (rows {rows.min()}-{rows.max()})")
        episodes += int(np.sum(terminations | truncations))
    elapsed = time.perf_counter() - start
    print(
        f"{STEPS} steps of {NUM_ENVS} envs in {elapsed:.2f} s "
        f"({STEPS * NUM_ENVS / elapsed:,.0f} env-steps/s); {episodes} episodes ended, "
        f"{restarted} of them by a restart"
    )
    print(f"  infos['error'] of a restarted env: {example_error}")


async def partial_steps(venv: aiovec.AsyncioVectorEnv[Any, Any]) -> None:
    """Act on whichever envs answered first; re-send exactly those."""
    rng = np.random.default_rng(1)
    obs, _infos = await venv.reset(seed=7)
    venv.send(policy(obs, rng), np.arange(NUM_ENVS))  # start every env; returns at once
    sizes = []
    start = time.perf_counter()
    for _ in range(PARTIAL_ROUNDS):
        obs, _rewards, _terms, _truncs, _infos, env_ids = await venv.recv(min_envs=MIN_ENVS)
        sizes.append(len(env_ids))
        # Row k of obs is env env_ids[k]: the actions go back to the same envs.
        venv.send(policy(obs, rng), env_ids)
    elapsed = time.perf_counter() - start
    await venv.recv()  # wait for the envs still in flight before stepping otherwise
    print(
        f"partial stepping: {PARTIAL_ROUNDS} rounds of recv(min_envs={MIN_ENVS}), "
        f"{min(sizes)}-{max(sizes)} envs each (mean {np.mean(sizes):.1f}), "
        f"{sum(sizes) / elapsed:,.0f} env-steps/s"
    )


def report_latency(venv: aiovec.AsyncioVectorEnv[Any, Any]) -> None:
    """Per-env latency of recent calls; which envs (connections) are the slowest.

    A call is timed from the start of the vector call, so time queued for a
    ``max_concurrency`` token counts: with 32 envs and 16 tokens, the envs
    served second look slower than the server is.
    """
    stats = venv.latency_stats()
    print(
        f"latency of calls that waited: p50 {stats.overall_p50 * 1e3:.1f} ms, "
        f"p99 {stats.overall_p99 * 1e3:.1f} ms over all envs"
    )
    slow = ", ".join(f"env {i} (p99 {stats.p99[i] * 1e3:.1f} ms)" for i in stats.slowest(3))
    print(f"  slowest envs: {slow}")


async def main() -> None:
    with GameServer(latency=0.002, jitter=0.002).start_in_thread() as server:
        print(f"game server on 127.0.0.1:{server.port}, 2 ms (+ up to 2 ms) per reply")

        def make_env() -> GameClientEnv:
            return GameClientEnv(port=server.port)  # connects in its first reset

        venv: aiovec.AsyncioVectorEnv[Any, Any] = aiovec.AsyncioVectorEnv(
            [make_env] * NUM_ENVS,
            step_timeout=1.0,  # seconds a step may take; a late env fails (and is restarted)
            reset_timeout=5.0,  # resets connect: give them longer
            on_error=aiovec.RestartPolicy(attempts=3, backoff=0.05, max_restarts=5),
            max_concurrency=16,  # at most 16 requests in flight to the server
        )
        async with venv:  # closes every env (and its connection) on the way out
            await train(venv, server)
            await partial_steps(venv)
            report_latency(venv)
        print(f"closed; the server answered {server.server.stats.steps:,} steps")


if __name__ == "__main__":
    asyncio.run(main())
