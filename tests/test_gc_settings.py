"""aiovec never changes the process's garbage collector settings (docs/performance.md)."""

from __future__ import annotations

import gc

import numpy as np

from aiovec.testing import TrivialEnv


def collector() -> tuple[object, ...]:
    """The settings a program may choose: on or off, thresholds, frozen objects."""
    return gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()


def test_building_stepping_and_closing_leave_the_collector_as_it_was(make_venv):
    old = gc.get_threshold()
    gc.set_threshold(1234, 5, 6)  # not the defaults, so that setting them back would show
    try:
        before = collector()
        venv = make_venv([TrivialEnv] * 3)
        venv.reset(seed=0)
        venv.step(np.zeros(3, dtype=np.int64))
        during = collector()
        venv.shutdown()
        assert (during, collector()) == (before, before)
    finally:
        gc.set_threshold(*old)
