"""Draw docs/img/autoreset-*.png: what each autoreset mode returns, step by step.

The pictures are not drawn by hand: two scripted envs run through
``aiovec.BlockingVectorEnv`` in each ``AutoresetMode`` and every returned value
is drawn as it came back.  Env 0's episodes end by *termination* after 2 steps,
env 1's by *truncation* after 3.  An observation is ``10 * episode + t`` (so
``20`` is the first observation of episode 2) and the reward of step ``t`` is
``t``.  Under ``DISABLED`` the script resets an env that ended with
``reset(options={"reset_mask": ...})`` before the next step, as a user must.

Run it with ``python tools/autoreset_pictures.py [OUT_DIR]`` (needs matplotlib:
``pip install "aiovec[plot]"``); CI runs it before building the docs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from matplotlib.figure import Figure

import aiovec

STEPS = 6
LENGTHS = (2, 3)  # episode length of env 0 (terminates) and env 1 (truncates)
COLOURS = {"start": "#d8f0d8", "terminated": "#f6c9c9", "truncated": "#f9e0b8", "plain": "white"}


class Scripted(gym.Env[np.ndarray, int]):
    """Episodes of a fixed length; obs ``10 * episode + t``, reward ``t``."""

    observation_space = gym.spaces.Box(0, 1000, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int, truncates: bool) -> None:
        self.length, self.truncates = length, truncates
        self.episode = self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        ended = self.t >= self.length
        return (
            self._obs(),
            float(self.t),
            ended and not self.truncates,
            ended and self.truncates,
            {},
        )

    def _obs(self) -> np.ndarray:
        return np.array([10 * self.episode + self.t], np.float32)


def record(mode: AutoresetMode) -> list[tuple[str, list[dict[str, Any]]]]:
    """Columns of ``(call, one cell per env)`` as the vector env returned them."""
    fns = [lambda: Scripted(LENGTHS[0], False), lambda: Scripted(LENGTHS[1], True)]
    columns = []
    with aiovec.BlockingVectorEnv(fns, autoreset_mode=mode) as envs:
        obs, _ = envs.reset(seed=0)
        columns.append(("reset()", [{"obs": o[0], "kind": "start"} for o in obs]))
        for _ in range(STEPS):
            obs, rewards, terms, truncs, infos = envs.step(np.zeros(2, np.int64))
            cells = [cell(i, obs, rewards, terms, truncs, infos) for i in (0, 1)]
            if mode is AutoresetMode.NEXT_STEP:
                for entry in cells:
                    entry["ignored"] = entry["kind"] == "start"  # this step only reset the env
            columns.append(("step()", cells))
            ended = terms | truncs
            if mode is AutoresetMode.DISABLED and ended.any():
                obs, _ = envs.reset(options={"reset_mask": ended})
                cells = [
                    {"obs": obs[i][0], "kind": "start" if ended[i] else "idle"} for i in (0, 1)
                ]
                columns.append(("reset(mask)", cells))
    return columns


def cell(
    i: int, obs: Any, rewards: Any, terms: Any, truncs: Any, infos: dict[str, Any]
) -> dict[str, Any]:
    """What env ``i`` got back from one step."""
    kind = "terminated" if terms[i] else "truncated" if truncs[i] else "plain"
    value = obs[i][0]
    if value % 10 == 0:  # an episode's first observation came back from a step
        kind = "start"
    entry = {"obs": value, "reward": rewards[i], "kind": kind}
    if infos.get("_final_obs", np.zeros(2, bool))[i]:
        entry["final_obs"] = infos["final_obs"][i][0]
        entry["ended"] = "terminated" if terms[i] else "truncated"
    return entry


def draw(mode: AutoresetMode, columns: list[tuple[str, list[dict[str, Any]]]], path: Path) -> None:
    """One row per env, one column per call; colours say what each cell is."""
    figure = Figure(figsize=(1.25 * len(columns) + 1.2, 3.1), layout="constrained")
    axes = figure.add_subplot()
    axes.set_xlim(-1.1, len(columns))
    axes.set_ylim(-0.25, 2.4)
    axes.axis("off")
    for x, (call, cells) in enumerate(columns):
        axes.text(x + 0.45, 2.2, call, ha="center", fontsize=8, family="monospace")
        for row, entry in enumerate(cells):
            y = 1.05 - row * 1.05
            axes.add_patch(_box(x, y, COLOURS.get(entry["kind"], "#eeeeee")))
            axes.text(x + 0.45, y + 0.5, _label(entry), ha="center", va="center", fontsize=7.5)
    for row, name in enumerate(("env 0\n(terminates)", "env 1\n(truncates)")):
        axes.text(-0.55, 1.55 - row * 1.05, name, ha="center", va="center", fontsize=8)
    axes.set_title(f"autoreset_mode = AutoresetMode.{mode.name}", fontsize=10)
    axes.text(
        len(columns) / 2 - 0.5,
        -0.1,
        "green: an episode's first observation    red: terminated    orange: truncated",
        ha="center",
        fontsize=7.5,
    )
    figure.savefig(path, dpi=110)


def _box(x: float, y: float, colour: str) -> Any:
    from matplotlib.patches import FancyBboxPatch  # noqa: PLC0415  (with matplotlib above)

    return FancyBboxPatch(
        (x + 0.03, y + 0.05), 0.84, 0.9, boxstyle="round,pad=0.02", fc=colour, ec="#888888"
    )


def _label(entry: dict[str, Any]) -> str:
    lines = [f"obs {entry['obs']:g}"]
    if "reward" in entry:
        lines.append(f"reward {entry['reward']:g}")
    if entry["kind"] in ("terminated", "truncated"):
        lines.append(entry["kind"])
    if "final_obs" in entry:
        lines.append(f"{entry['ended']}\nfinal_obs {entry['final_obs']:g}")
    if entry["kind"] == "idle":
        lines.append("(not reset)")
    if entry.get("ignored"):
        lines.append("(action ignored)")
    return "\n".join(lines)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[1] / "docs" / "img"
    out.mkdir(parents=True, exist_ok=True)
    for mode in AutoresetMode:
        path = out / f"autoreset-{mode.name.lower().replace('_', '-')}.png"
        draw(mode, record(mode), path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
