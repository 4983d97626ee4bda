"""Backends: where envs live.  Each is loaded lazily, by name, on first use.

``import aiovec`` imports none of them; a backend whose optional dependency is
missing says which extra to install.  The names are `aiovec._core.validate.BACKENDS`;
backend ``name`` is the class ``NameBackend`` of module ``aiovec.backends.name``.
"""

from __future__ import annotations

import importlib

from aiovec._core.validate import BACKENDS, check_choice
from aiovec.backends._base import Backend, EnvTraits

__all__ = ("Backend", "EnvTraits", "load_backend")

_EXTRAS = {"ray": "ray"}  # backend -> (the top-level module it needs, and) its extra


def load_backend(name: str) -> type[Backend]:
    """The backend class of ``name``, one of ``BACKENDS`` (imported on first use).

    Raises:
        ValueError: ``name`` is not a backend.
        ModuleNotFoundError: The backend's optional dependency is not installed
            (the message says which extra to install).
    """
    check_choice("backend", name, BACKENDS)
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        extra = _EXTRAS.get(name)
        if extra is None or exc.name != extra:
            raise
        raise ModuleNotFoundError(
            f"backend={name!r} needs {extra}, which is not installed: "
            f'pip install "aiovec[{extra}]"',
            name=exc.name,
        ) from exc
    cls: type[Backend] = getattr(module, f"{name.capitalize()}Backend")
    return cls
