"""Values, spaces and errors as msgpack data: what crosses the wire besides step arrays.

Nothing here unpickles, imports or calls anything a peer names: decoding makes
only plain values (``None``, bools, ints, floats, strings, bytes, lists, dicts),
tuples, numpy arrays and scalars of plain dtypes (never ``object``: an
``object`` array travels element by element), gymnasium spaces of the kinds
listed in `space_to_data`, and exceptions of classes this process has already
imported (a server's own exception classes come back as `RemoteError`).

msgpack arrays decode as lists, so a tuple, an array and a numpy scalar are
msgpack *extension* values (codes `EXT_TUPLE`, `EXT_ARRAY`, `EXT_SCALAR`,
`EXT_OBJECTS`); docs/serve.md gives their layout.
"""

from __future__ import annotations

import builtins
import sys
import traceback
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
from gymnasium import spaces

from aiovec._errors import EnvError

__all__ = (
    "EXT_ARRAY",
    "EXT_OBJECTS",
    "EXT_SCALAR",
    "EXT_TUPLE",
    "RemoteError",
    "check_dtype",
    "data_to_error",
    "data_to_space",
    "error_to_data",
    "pack",
    "packb",
    "space_to_data",
    "unpackb",
)

EXT_TUPLE = 1
EXT_ARRAY = 2
EXT_SCALAR = 3
EXT_OBJECTS = 4

_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})
_SAFE_KINDS = frozenset("biufcSU?")


class RemoteError(RuntimeError):
    """An exception raised on the server whose class this process does not have.

    ``type_name`` is the class's ``module.qualname`` there; the message is its ``str``.
    """

    def __init__(self, message: str, type_name: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.type_name))


def check_dtype(text: object) -> np.dtype[Any]:
    """A dtype named by a peer: a plain one (numbers, bools, strings), never ``object``.

    Raises:
        ValueError: ``text`` is not the name of such a dtype.
    """
    if not isinstance(text, str) or len(text) > 16:
        raise ValueError(f"expected a dtype name, got {text!r}")
    try:
        dtype = np.dtype(text)
    except TypeError as exc:
        raise ValueError(f"expected a dtype name, got {text!r}") from exc
    if dtype.kind not in _SAFE_KINDS or dtype.hasobject or dtype.fields is not None:
        raise ValueError(f"dtype {text!r} may not cross the wire (plain dtypes only)")
    return dtype


# --------------------------------------------------------------------------- values

_ENCODER = msgspec.msgpack.Encoder()


def pack(value: Any) -> Any:
    """``value`` as a tree msgpack can encode (tuples, arrays, numpy scalars as extensions).

    Raises:
        TypeError: ``value`` holds something that cannot be sent (the message says what).
    """
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is list:
        return [pack(item) for item in value]
    if kind is dict:
        return {_key(key): pack(item) for key, item in value.items()}
    if kind is tuple:
        return msgspec.msgpack.Ext(EXT_TUPLE, _ENCODER.encode([pack(item) for item in value]))
    if kind is np.ndarray:
        return _pack_array(value)
    if isinstance(value, np.generic) and value.dtype.kind in _SAFE_KINDS:
        return msgspec.msgpack.Ext(EXT_SCALAR, _ENCODER.encode([value.dtype.str, value.tobytes()]))
    raise TypeError(
        f"a {kind.__module__}.{kind.__qualname__} cannot be sent over the wire (plain data, "
        "tuples, lists, dicts and numpy arrays and scalars can)"
    )


def _key(key: Any) -> Any:
    if type(key) in _PLAIN and type(key) is not bytes:
        return key
    raise TypeError(f"a dict key of type {type(key).__name__} cannot be sent over the wire")


def _pack_array(array: np.ndarray) -> msgspec.msgpack.Ext:
    if array.dtype.hasobject:
        items = [pack(item) for item in array.ravel().tolist()]
        return msgspec.msgpack.Ext(EXT_OBJECTS, _ENCODER.encode([list(array.shape), items]))
    if array.dtype.kind not in _SAFE_KINDS or array.dtype.fields is not None:
        raise TypeError(f"an array of dtype {array.dtype} cannot be sent over the wire")
    data = np.ascontiguousarray(array).tobytes()
    return msgspec.msgpack.Ext(
        EXT_ARRAY, _ENCODER.encode([array.dtype.str, list(array.shape), data])
    )


def _ext(code: int, data: memoryview) -> Any:
    """Decode one extension value (`EXT_TUPLE`, ...)."""
    if code == EXT_TUPLE:
        return tuple(_list(_DECODER.decode(data)))
    if code == EXT_ARRAY:
        dtype_name, shape, raw = _DECODER.decode(data)
        dtype = check_dtype(dtype_name)
        shape = _shape(shape)
        count = int(np.prod(shape, dtype=np.int64))
        if not isinstance(raw, bytes) or len(raw) != count * dtype.itemsize:
            raise ValueError("an array's bytes do not match its dtype and shape")
        return np.frombuffer(raw, dtype).reshape(shape).copy()
    if code == EXT_SCALAR:
        dtype_name, raw = _DECODER.decode(data)
        dtype = check_dtype(dtype_name)
        if not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
            raise ValueError("a scalar's bytes do not match its dtype")
        return np.frombuffer(raw, dtype)[0]
    if code == EXT_OBJECTS:
        shape, items = _DECODER.decode(data)
        shape = _shape(shape)
        items = _list(items)
        out = np.empty(len(items), dtype=object)
        out[:] = items if items else out
        return out.reshape(shape)
    raise ValueError(f"unknown extension code {code}")


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {type(value).__name__}")
    return value


def _shape(value: Any) -> tuple[int, ...]:
    shape = tuple(_list(value))
    if len(shape) > 32 or not all(type(n) is int and 0 <= n < 2**31 for n in shape):
        raise ValueError(f"a bad array shape {shape!r}")
    return shape


_DECODER: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(ext_hook=_ext)


def packb(value: Any) -> bytes:
    """``value`` encoded (`pack`, then msgpack)."""
    return _ENCODER.encode(pack(value))


def unpackb(data: bytes | memoryview) -> Any:
    """A value encoded by `packb`.

    Raises:
        ValueError: ``data`` is not such a value.
    """
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, TypeError) as exc:
        raise ValueError(f"a malformed value: {exc}") from exc


def ext_hook() -> Callable[[int, memoryview], Any]:
    """The extension decoder, for decoders that hold values in messages."""
    return _ext


# --------------------------------------------------------------------------- spaces


def space_to_data(space: spaces.Space[Any]) -> dict[str, Any]:
    """A gymnasium space as data.

    Box, Discrete, MultiDiscrete, MultiBinary, Text, and Dict, Tuple, Sequence,
    Graph and OneOf of them.

    Raises:
        TypeError: Another kind of space.
    """
    if isinstance(space, spaces.Box):
        return {"space": "Box", "low": space.low, "high": space.high, "dtype": space.dtype.str}
    if isinstance(space, spaces.Discrete):
        return {"space": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"space": "MultiDiscrete", "nvec": space.nvec, "start": space.start}
    if isinstance(space, spaces.MultiBinary):
        return {"space": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Dict):
        items = {key: space_to_data(sub) for key, sub in space.spaces.items()}
        return {"space": "Dict", "spaces": items}
    if isinstance(space, spaces.Tuple):
        return {"space": "Tuple", "spaces": [space_to_data(sub) for sub in space.spaces]}
    if isinstance(space, spaces.Text):
        charset = "".join(sorted(space.character_set))
        return {"space": "Text", "max": space.max_length, "min": space.min_length, "chars": charset}
    if isinstance(space, spaces.Sequence):
        return {
            "space": "Sequence",
            "feature": space_to_data(space.feature_space),
            "stack": space.stack,
        }
    if isinstance(space, spaces.Graph):
        edge = None if space.edge_space is None else space_to_data(space.edge_space)
        return {"space": "Graph", "node": space_to_data(space.node_space), "edge": edge}
    if isinstance(space, spaces.OneOf):
        return {"space": "OneOf", "spaces": [space_to_data(sub) for sub in space.spaces]}
    raise TypeError(f"a {type(space).__name__} space cannot be described over the wire")


def data_to_space(data: Any) -> spaces.Space[Any]:
    """The space `space_to_data` described.

    Raises:
        ValueError: ``data`` describes no space.
    """
    try:
        return _SPACES[data["space"]](data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"a malformed space description: {exc!r}") from exc


_SPACES: dict[str, Callable[[Any], spaces.Space[Any]]] = {
    "Box": lambda d: spaces.Box(d["low"], d["high"], dtype=check_dtype(d["dtype"])),
    "Discrete": lambda d: spaces.Discrete(d["n"], start=d["start"]),
    "MultiDiscrete": lambda d: spaces.MultiDiscrete(d["nvec"], start=d["start"]),
    "MultiBinary": lambda d: spaces.MultiBinary(d["n"]),
    "Dict": lambda d: spaces.Dict({k: data_to_space(v) for k, v in d["spaces"].items()}),
    "Tuple": lambda d: spaces.Tuple([data_to_space(v) for v in d["spaces"]]),
    "Text": lambda d: spaces.Text(d["max"], min_length=d["min"], charset=d["chars"]),
    "Sequence": lambda d: spaces.Sequence(data_to_space(d["feature"]), stack=d["stack"]),
    "Graph": lambda d: spaces.Graph(
        data_to_space(d["node"]), None if d["edge"] is None else data_to_space(d["edge"])
    ),
    "OneOf": lambda d: spaces.OneOf([data_to_space(v) for v in d["spaces"]]),
}


# --------------------------------------------------------------------------- errors


def error_to_data(error: BaseException, depth: int = 0) -> dict[str, Any]:
    """An exception as data: its class's name, message, arguments, traceback and cause.

    An `aiovec.EnvError` carries its errors by env (each as data) and its operation.
    """
    kind = type(error)
    data: dict[str, Any] = {
        "type": kind.__qualname__,
        "module": kind.__module__,
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error, chain=False))[-8000:],
    }
    if isinstance(error, EnvError):
        data["errors"] = {i: error_to_data(e, depth + 1) for i, e in error.errors.items()}
        data["operation"] = error.operation
    else:
        try:
            data["args"] = pack(list(error.args))
        except TypeError:
            data["args"] = None
    cause = error.__cause__
    if cause is not None and depth < 4:
        data["cause"] = error_to_data(cause, depth + 1)
    return data


def data_to_error(data: Any) -> Exception:
    """The exception `error_to_data` described, as near as this process can make it.

    The class is found among builtins, aiovec's errors and the modules this
    process has imported (nothing is imported); failing that, or if it will not
    take the arguments, a `RemoteError` says what it was.  The server's
    traceback is a note.
    """
    if not isinstance(data, dict):
        return RemoteError(f"a malformed error report: {data!r}")
    name = f"{data.get('module')}.{data.get('type')}"
    message = str(data.get("message", ""))
    cls = _exception_class(data.get("module"), data.get("type"))
    error: Exception | None = None
    if cls is not None:
        try:
            if issubclass(cls, EnvError) and isinstance(data.get("errors"), dict):
                errors = {int(i): data_to_error(e) for i, e in data["errors"].items()}
                error = cls(errors, str(data.get("operation", "step()")))
            elif isinstance(data.get("args"), list):
                error = cls(*data["args"])
        except Exception:
            error = None
    if error is None:
        error = RemoteError(f"{name}: {message}" if message else name, name)
    cause = data.get("cause")
    if cause is not None:
        error.__cause__ = data_to_error(cause)
    text = data.get("traceback")
    if isinstance(text, str) and text:
        error.add_note("raised on the aiovec server:\n" + text.rstrip())
    return error


def _exception_class(module: object, qualname: object) -> type[Exception] | None:
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    owner: Any = builtins if module == "builtins" else sys.modules.get(module)
    for part in qualname.split("."):
        if owner is None or (part.startswith("_") and part != qualname.split(".")[-1]):
            return None
        owner = getattr(owner, part, None)
    if isinstance(owner, type) and issubclass(owner, Exception):
        return owner
    return None
