"""A CleanRL-style synchronous script: aiovec in place of ``SyncVectorEnv``.

Scripts written for ``gymnasium.vector.SyncVectorEnv`` run on aiovec by
swapping one constructor for ``aiovec.BlockingVectorEnv``: same arguments
(a list of env factories), same ``reset``/``step`` results, and gymnasium's
vector wrappers (here ``RecordEpisodeStatistics``) work on it unchanged.  No
``await`` anywhere.  A random policy plays CartPole-v1 and the mean episodic
return is printed from ``infos["episode"]``, the rows picked by its
``infos["_episode"]`` mask.

Run it with ``python examples/sync_script.py --steps 500``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

import aiovec


def make_env(env_id: str) -> Callable[[], gym.Env[Any, Any]]:
    def thunk() -> gym.Env[Any, Any]:
        return gym.make(env_id)

    return thunk


def random_policy(obs: np.ndarray, action_space: gym.Space[Any]) -> Any:
    """Stand-in for an agent: one random action per env, whatever ``obs`` says."""
    del obs
    return action_space.sample()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200, help="vector steps to run")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args()


def main() -> None:
    args = parse_args()

    # envs = gym.vector.SyncVectorEnv([make_env(args.env_id) for _ in range(args.num_envs)])
    envs = aiovec.BlockingVectorEnv([make_env(args.env_id) for _ in range(args.num_envs)])
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "discrete actions only"

    envs.action_space.seed(args.seed)
    obs, _ = envs.reset(seed=args.seed)
    episodic_returns: list[float] = []
    for _ in range(args.steps):
        actions = random_policy(obs, envs.action_space)
        obs, _rewards, _terminations, _truncations, infos = envs.step(actions)
        if "episode" in infos:
            finished = infos["_episode"]
            episodic_returns.extend(infos["episode"]["r"][finished].tolist())
    envs.close()

    print(
        f"{args.env_id}, {args.num_envs} envs, {args.steps} steps: "
        f"{len(episodic_returns)} episodes, "
        f"mean episodic return {np.mean(episodic_returns or [np.nan]):.1f}"
    )


if __name__ == "__main__":
    main()
