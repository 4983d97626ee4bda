"""Adapters to other RL libraries' vector env APIs (each needs its optional extra).

- `aiovec.compat.sb3`: an aiovec vector env as a Stable-Baselines3
  ``VecEnv`` (``pip install "aiovec[sb3]"``).
- `aiovec.compat.tianshou`: an aiovec vector env as a Tianshou vector env
  (``pip install "aiovec[tianshou]"``).

Nothing is imported here: ``import aiovec.compat`` never loads a third-party library.
"""
