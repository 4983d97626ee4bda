"""The leak checks themselves: each kind of leak is caught, and a clean run reports none."""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import socket
import threading
from multiprocessing import shared_memory

import numpy as np
import pytest

import aiovec
from aiovec.testing import SpaceEnv
from faults.leaks import SUPPORTED, LeakCheck, pending_tasks

pytestmark = pytest.mark.skipif(not SUPPORTED, reason="the leak checks read /proc (Linux)")


def test_a_thread_left_running_is_reported():
    check = LeakCheck.start()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="left-behind")
    thread.start()
    try:
        leaks = check.finish(grace=0.01)
    finally:
        stop.set()
        thread.join()
    assert any("left-behind" in leak for leak in leaks), leaks


def test_an_open_socket_is_reported():
    check = LeakCheck.start()
    sock = socket.socket()
    fd = sock.fileno()
    try:
        leaks = check.finish()
    finally:
        sock.close()
    assert any(leak.startswith(f"fd {fd} -> socket:") for leak in leaks), leaks


def test_a_child_process_left_running_is_reported():
    check = LeakCheck.start()
    child = multiprocessing.get_context("fork").Process(target=signal.pause, daemon=True)
    child.start()
    try:
        leaks = check.finish(grace=0.01)
    finally:
        child.kill()
        child.join()
    assert any(f"child process {child.pid}" in leak for leak in leaks), leaks


def test_a_shared_memory_block_never_unlinked_is_reported():
    check = LeakCheck.start()
    block = shared_memory.SharedMemory(create=True, size=64)
    try:
        block.close()
        leaks = check.finish()
    finally:
        block.unlink()
    assert any(block.name.lstrip("/") in leak for leak in leaks), leaks
    assert LeakCheck.start().finish() == []  # unlinked now: nothing to report


def test_a_shared_memory_block_still_mapped_is_reported():
    check = LeakCheck.start()
    block = shared_memory.SharedMemory(create=True, size=64)
    block.unlink()  # gone from /dev/shm, but still mapped here
    try:
        leaks = check.finish()
    finally:
        block.close()
    assert any("still mapped" in leak for leak in leaks), leaks


@pytest.mark.asyncio
async def test_a_task_left_pending_is_reported():
    task = asyncio.get_running_loop().create_task(asyncio.Event().wait())
    try:
        assert pending_tasks(asyncio.get_running_loop()) == [task]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert pending_tasks(asyncio.get_running_loop()) == []


@pytest.mark.parametrize("backend", ["inline", "thread", "process"])
@pytest.mark.asyncio
async def test_a_closed_vector_env_leaves_nothing(backend):
    """No false alarm: a vector env that is closed properly, then dropped, passes every check."""
    check = LeakCheck.start()
    async with aiovec.AsyncioVectorEnv([SpaceEnv] * 2, backend=backend) as venv:
        await venv.reset(seed=0)
        await venv.step(np.zeros(2, np.int64))
    del venv
    assert pending_tasks(asyncio.get_running_loop()) == []
    assert check.finish() == []
