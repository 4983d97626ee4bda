"""Backends: where envs live.  Each is loaded lazily, by name, on first use.

``import aiovec`` imports none of them; a backend whose optional dependency is
missing says which extra to install.
"""

from __future__ import annotations

import importlib

from aiovec.backends._base import Backend, EnvTraits

__all__ = ("Backend", "EnvTraits", "load_backend")

_MODULES = {
    "inline": ("aiovec.backends.inline", "InlineBackend"),
    "thread": ("aiovec.backends.thread", "ThreadBackend"),
    "process": ("aiovec.backends.process", "ProcessBackend"),
}
_PLANNED = {
    "ray": 'the Ray backend (pip install "aiovec[ray]")',
}


def load_backend(name: str) -> type[Backend]:
    """The backend class registered under ``name`` (imported on first use)."""
    if name in _PLANNED and name not in _MODULES:
        raise NotImplementedError(
            f"backend={name!r}: {_PLANNED[name]} is not part of this release yet; "
            "use backend='inline'"
        )
    module_name, attr = _MODULES[name]
    cls: type[Backend] = getattr(importlib.import_module(module_name), attr)
    return cls
