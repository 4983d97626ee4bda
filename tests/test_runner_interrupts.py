"""A Ctrl-C while the runner sets up its loop: delivered once the loop is whole, nothing left."""

from __future__ import annotations

import asyncio
import signal

import pytest

from aiovec._runner import Runner, _ctrl_c_deferred


def interrupted_block(reached: list[str]) -> None:
    with _ctrl_c_deferred():
        signal.raise_signal(signal.SIGINT)
        reached.append("the end of the block")


def test_a_ctrl_c_during_a_deferred_block_is_raised_when_it_ends():
    reached: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        interrupted_block(reached)
    assert reached == ["the end of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_while_the_loop_is_made_leaves_it_whole_and_the_call_closed(monkeypatch):
    make_loop = asyncio.Runner.get_loop

    def interrupted(self: asyncio.Runner) -> asyncio.AbstractEventLoop:
        signal.raise_signal(signal.SIGINT)  # Ctrl-C half-way through making the loop
        return make_loop(self)

    monkeypatch.setattr(asyncio.Runner, "get_loop", interrupted)

    async def call() -> int:
        return 1

    runner = Runner()
    coro = call()
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run(coro)
        assert coro.cr_frame is None  # closed: no "coroutine was never awaited"
        assert asyncio._get_running_loop() is None  # the loop is not left marked as running
        assert runner._loop is not None
        assert not runner._loop.is_closed()  # made whole before the interrupt was raised
    finally:
        runner.close()
