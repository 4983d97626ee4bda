"""The vector env's options: the one list of their names.

`AsyncioVectorEnv` and `BlockingVectorEnv` spell them out as keyword
parameters (so editors show them); ``aiovec.make`` routes its keyword
arguments by this list: an option goes to the vector env, anything else to
each env.  ``tests/test_options.py`` ties the three together.
"""

from __future__ import annotations

__all__ = ("VECTOR_OPTIONS",)

VECTOR_OPTIONS = (
    "backend",
    "num_workers",
    "autoreset_mode",
    "step_timeout",
    "on_error",
    "copy",
    "reset_timeout",
    "max_concurrency",
    "backend_options",
    "reset_options",
    "observation_mode",
    "check_observations",
)
"""The keyword-only parameters of the vector env's constructor, in order."""
