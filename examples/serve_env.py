"""Envs on a server, stepped from a client: ``aiovec serve`` and ``aiovec.make("ws://...")``.

Run it with ``python examples/serve_env.py`` after ``pip install "aiovec[serve]"``.
``--quick`` (or ``AIOVEC_EXAMPLES_QUICK=1``, which CI sets) takes fewer steps.

1. **The server.**  ``with aiovec.serve(make_env)`` serves CartPole on 127.0.0.1
   on a thread (and event loop) of its own: the blocking client below, in the
   same process, would otherwise wait on the loop that serves it.  On another
   machine you would run
   ``python -m aiovec serve examples.serve_env:make_env --host 0.0.0.0 --token T``.
2. **The blocking client.**  ``aiovec.make(server.url, 16)`` is a
   ``gymnasium.vector.VectorEnv`` whose 16 envs are sessions on that server: one
   frame per vector step for all of them.
3. **An async program that serves and steps on one loop.**  ``async with
   aiovec.serve(make_env)`` runs the server on the program's own loop, and
   ``await server.connect(8, ...)`` builds the await API there (keywords that are
   not the vector env's reach ``make_env``: ``max_episode_steps``).
4. **A dropped connection** is resumed: the rollout goes on exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import gymnasium
import numpy as np

import aiovec


def make_env(max_episode_steps: int = 500) -> Any:
    """What the server builds for each session."""
    return gymnasium.make("CartPole-v1", max_episode_steps=max_episode_steps)


def blocking_client(url: str, steps: int) -> None:
    envs = aiovec.make(url, 16)
    try:
        envs.reset(seed=0)
        started = time.perf_counter()
        for _ in range(steps):
            envs.step(envs.action_space.sample())
        rate = 16 * steps / (time.perf_counter() - started)
        print(f"blocking: {16 * steps} env-steps over one connection, {rate:,.0f} env-steps/s")
    finally:
        envs.close()


async def serve_and_step(steps: int) -> None:
    async with (
        aiovec.serve(make_env) as server,  # on this program's loop
        await server.connect(8, max_episode_steps=20) as venv,
    ):
        await venv.reset(seed=1)
        ended = 0
        for k in range(steps):
            if k == steps // 2:
                venv._backend.drop_connection()  # as a network fault would; resumed at once
            _, _, terminations, truncations, _ = await venv.step(np.ones(8, np.int64))
            ended += int((terminations | truncations).sum())
        print(f"await: {8 * steps} env-steps, {ended} episodes ended, a drop resumed on the way")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick or os.environ.get("AIOVEC_EXAMPLES_QUICK") == "1"
    steps = 20 if quick else 500
    with aiovec.serve(make_env) as server:
        print(f"serving on {server.url}")
        blocking_client(server.url, steps)
    asyncio.run(serve_and_step(steps))


if __name__ == "__main__":
    main()
