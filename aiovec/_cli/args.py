"""Argument types for the commands: a bad value is refused naming what was expected."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

__all__ = ("int_list", "json_object", "non_negative_float", "positive_float", "positive_int")


def positive_int(text: str) -> int:
    """An int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite float >= 0."""
    value = _float(text, "a number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value:g}")
    return value


def positive_float(text: str) -> float:
    """A finite float > 0."""
    value = _float(text, "a number > 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value:g}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """Comma-separated ints >= 1, e.g. ``8,32,128`` (sorted, duplicates dropped)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints >= 1, got {text!r}")
    return tuple(sorted({positive_int(part) for part in parts}))


def json_object(text: str) -> dict[str, Any]:
    """A JSON object, e.g. ``{"size": 7, "level": "hard"}``."""
    expected = "expected a JSON object such as '{\"size\": 7}'"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r} ({exc.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{expected}, got {type(value).__name__} {text}")
    return value
