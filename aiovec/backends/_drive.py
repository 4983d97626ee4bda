"""Drivers: push a core flow through one env, synchronously or with ``await``.

These are the only places that turn a call value into a method call on an env.
Every backend uses them (inline in the caller's loop, the thread backend on a
worker thread, the process backend inside its worker), closing included: an
env's ``close()`` gets `CLOSE_TIMEOUT` seconds wherever it is made.
"""

from __future__ import annotations

import asyncio
import inspect
import types
from collections.abc import Coroutine, Sequence
from typing import Any, cast

import gymnasium

from aiovec._core.calls import (
    CLOSE,
    STEP,
    CallMethod,
    Close,
    EnvCall,
    GetAttr,
    IsWrapped,
    Render,
    Reset,
    SetAttr,
    StepFlow,
    Transition,
)

__all__ = (
    "CLOSE_TIMEOUT",
    "StepFlow",
    "aclose_quietly",
    "async_call",
    "close_quietly",
    "coroutine_of",
    "perform_async",
    "perform_sync",
    "step_async",
    "step_sync",
)

CLOSE_TIMEOUT = 10.0
"""Seconds an env's ``close()`` may take; an env still closing then is abandoned."""


def _get_attr(env: Any, name: str) -> Any:
    getter = getattr(env, "get_wrapper_attr", None)
    return getter(name) if getter is not None else getattr(env, name)


def _set_attr(env: Any, name: str, value: Any) -> None:
    setter = getattr(env, "set_wrapper_attr", None)
    if setter is not None:
        setter(name, value)
    else:
        setattr(env, name, value)


def _is_wrapped(env: Any, wrapper: type) -> bool:
    """Whether ``env`` or a gymnasium wrapper inside it (through ``.env``) is a ``wrapper``."""
    while True:
        if isinstance(env, wrapper):
            return True
        if not isinstance(env, gymnasium.Wrapper):
            return False
        env = env.env


def perform_sync(env: Any, call: EnvCall, action: Any = None) -> Any:
    """Make one call on a synchronous env."""
    if call is STEP:
        return env.step(action)
    kind = type(call)
    if kind is Reset:
        assert isinstance(call, Reset)
        if call.options is None:  # as SB3's vec envs: an env's reset(seed) may take no options
            return env.reset(seed=call.seed)
        return env.reset(seed=call.seed, options=call.options)
    if kind is Render:
        return env.render()
    if kind is Close:
        return env.close()
    if kind is GetAttr:
        assert isinstance(call, GetAttr)
        return _get_attr(env, call.name)
    if kind is CallMethod:
        assert isinstance(call, CallMethod)
        target = _get_attr(env, call.name)
        return target(*call.args, **(call.kwargs or {})) if callable(target) else target
    if kind is IsWrapped:
        assert isinstance(call, IsWrapped)
        return _is_wrapped(env, call.wrapper)
    assert isinstance(call, SetAttr), call
    _set_attr(env, call.name, call.value)
    return None


def async_call(env: Any, call: EnvCall, action: Any = None) -> Coroutine[Any, Any, Any]:
    """The coroutine of one call on an async env, to be driven by hand.

    A step is the env's own ``step`` coroutine, with no wrapper around it: the
    inline backend drives it eagerly and sends its value into the env's flow
    with a plain call (a coroutine per env-step fewer than `step_async`).
    """
    if call is STEP:
        return coroutine_of(env.step(action))
    return perform_async(env, call, action)


def coroutine_of(awaitable: Any) -> Coroutine[Any, Any, Any]:
    """``awaitable`` if it is a native coroutine (``async def``), else one that awaits it.

    An env's ``step`` marked as a coroutine function (``inspect.markcoroutinefunction``)
    may return any awaitable; what is driven by hand must be a coroutine.
    """
    if type(awaitable) is types.CoroutineType:
        return cast(Coroutine[Any, Any, Any], awaitable)
    return _awaiting(awaitable)


async def _awaiting(awaitable: Any) -> Any:
    return await awaitable


async def perform_async(env: Any, call: EnvCall, action: Any = None) -> Any:
    """Make one call on an async env (awaiting whatever it returns that is awaitable)."""
    if call is STEP:
        return await env.step(action)
    result = perform_sync(env, call, action)
    if inspect.isawaitable(result):
        return await result
    return result


def step_sync(env: Any, flow: StepFlow, reset_first: bool, action: Any) -> Transition:
    """One step of a synchronous env through its flow."""
    send = flow.send
    call = send(reset_first)
    while type(call) is not tuple:
        call = send(env.step(action) if call is STEP else perform_sync(env, cast(EnvCall, call)))
    return call


async def step_async(env: Any, flow: StepFlow, reset_first: bool, action: Any) -> Transition:
    """One step of an async env through its flow."""
    send = flow.send
    call = send(reset_first)
    while type(call) is not tuple:
        if call is STEP:
            call = send(await env.step(action))
        else:
            call = send(await perform_async(env, cast(EnvCall, call)))
    return call


def close_quietly(envs: Sequence[Any]) -> None:
    """Close envs best effort, without a loop (e.g. construction failed).

    Errors are ignored; an async env's close runs only as far as it goes
    without waiting.
    """
    for env in envs:
        try:
            result = perform_sync(env, CLOSE)
            if asyncio.iscoroutine(result):
                try:
                    result.send(None)
                except StopIteration:
                    pass
                else:
                    result.close()
        except Exception:  # the error that brought us here matters more
            continue


async def aclose_quietly(env: Any) -> None:
    """Close an env that already failed, best effort: errors ignored, a hang cut short."""
    try:
        await asyncio.wait_for(perform_async(env, CLOSE), CLOSE_TIMEOUT)
    except Exception:  # the env already failed; its close may well fail too
        return
