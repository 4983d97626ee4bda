"""Calls other than a step on the wire, both ways, and the checks of what a peer sends (pure).

A call is ``[kind, ...]``: ``["reset", seed, options]``, ``["render"]``,
``["get_attr", name]``, ``["set_attr", name, value]``,
``["call", name, args, kwargs]``, ``["is_wrapped", "module:qualname"]``.  The
client writes them (`call_data`), the server reads them back (`call_of`),
refusing anything a peer could use to reach what it should not: attribute
names must be public identifiers, a wrapper class one the server has imported,
a seed an int in ``[0, 2**64)``, options a dict keyed by strings.
"""

from __future__ import annotations

import sys
from typing import Any

from aiovec._core.calls import CallMethod, EnvCall, GetAttr, IsWrapped, Render, Reset, SetAttr
from aiovec._serve import codec

__all__ = ("call_data", "call_of", "check_options", "check_seed")


def call_data(call: EnvCall) -> list[Any]:
    """A call as the wire holds it (`call_of` reads it back).

    Raises:
        TypeError: A call that cannot be sent (a step, a close), or a value that cannot.
    """
    kind = type(call)
    if kind is Reset:
        assert isinstance(call, Reset)
        return ["reset", call.seed, codec.pack(call.options)]
    if kind is Render:
        return ["render"]
    if kind is GetAttr:
        assert isinstance(call, GetAttr)
        return ["get_attr", call.name]
    if kind is SetAttr:
        assert isinstance(call, SetAttr)
        return ["set_attr", call.name, codec.pack(call.value)]
    if kind is CallMethod:
        assert isinstance(call, CallMethod)
        return ["call", call.name, codec.pack(list(call.args)), codec.pack(call.kwargs)]
    if kind is IsWrapped:
        assert isinstance(call, IsWrapped)
        return ["is_wrapped", f"{call.wrapper.__module__}:{call.wrapper.__qualname__}"]
    raise TypeError(f"a {kind.__name__} cannot be sent to a server")


def call_of(data: Any) -> EnvCall:
    """A call from the wire (`call_data` wrote it).

    Raises:
        ValueError: A malformed or refused call.
    """
    if not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise ValueError(f"a malformed call: {data!r}")
    kind, args = data[0], data[1:]
    if kind == "reset" and len(args) == 2:
        return Reset(check_seed(args[0]), check_options(args[1]))
    if kind == "render" and not args:
        return Render()
    if kind == "get_attr" and len(args) == 1:
        return GetAttr(_name(args[0]))
    if kind == "set_attr" and len(args) == 2:
        return SetAttr(_name(args[0]), args[1])
    if kind == "call" and len(args) == 3 and isinstance(args[1], list):
        return CallMethod(_name(args[0]), tuple(args[1]), check_options(args[2]))
    if kind == "is_wrapped" and len(args) == 1:
        return IsWrapped(_wrapper(args[0]))
    raise ValueError(f"a malformed call: {data!r}")


def check_seed(seed: object) -> int | None:
    """A seed from the wire: ``None`` or an int in ``[0, 2**64)``.

    Raises:
        ValueError: Anything else.
    """
    if seed is None or (type(seed) is int and 0 <= seed < 2**64):
        return seed
    raise ValueError(f"a seed must be None or an int in [0, 2**64), got {seed!r}")


def check_options(options: object) -> dict[str, Any] | None:
    """Reset options (or keyword arguments) from the wire: ``None`` or a dict keyed by strings.

    Raises:
        ValueError: Anything else.
    """
    if options is None or (isinstance(options, dict) and all(type(k) is str for k in options)):
        return options
    raise ValueError(f"reset options must be None or a dict keyed by strings, got {options!r}")


def _name(name: object) -> str:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"attribute names must be public identifiers, got {name!r}")
    return name


def _wrapper(name: object) -> type:
    module, _, qualname = str(name).partition(":")
    owner: Any = sys.modules.get(module)
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
    if isinstance(owner, type):
        return owner
    raise ValueError(f"{name!r} is not a class the server has imported")
