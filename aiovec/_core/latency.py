"""Per-env latency of calls that waited: which server is slow, or is the client busy?

Pure: the backend measures, this module keeps the last ``window`` samples of
each env and summarises them.  A sample is two times: the env's own (from the
start of its call to its result) and its *queue wait* (what the call spent
waiting for a ``max_concurrency`` slot or for the loop, while other envs ran).
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

__all__ = ("LatencyBook", "LatencyStats")


@dataclass(frozen=True)
class LatencyStats:
    """Latency of each env's recent calls that waited, in seconds.

    Timed are the calls of async envs that suspended and every call on the
    thread backend; an env with no such call has NaN.  The figures are the
    env's own time, from the start of its call to its result; ``queue`` holds
    the same figures for the time those calls spent queued: waiting for a
    ``max_concurrency`` slot, or for their turn on a busy event loop.  A slow
    server shows in the first, a busy client in ``queue``.

    Attributes:
        count: Calls timed per env (at most the window kept).
        p50: Median latency per env.
        p99: 99th percentile per env.
        mean: Mean latency per env.
        overall_p50: Median over every env's samples.
        overall_p99: 99th percentile over every env's samples.
        queue: The queue wait of the same calls (its own ``queue`` is ``None``).
    """

    count: np.ndarray
    p50: np.ndarray
    p99: np.ndarray
    mean: np.ndarray
    overall_p50: float
    overall_p99: float
    queue: LatencyStats | None = None

    def slowest(self, k: int = 5) -> list[int]:
        """The ``k`` env indices with the highest p99 (envs never timed are left out)."""
        timed = np.flatnonzero(self.count > 0)
        order = timed[np.argsort(-self.p99[timed], kind="stable")]
        return [int(i) for i in order[:k]]


class LatencyBook:
    """The last ``window`` latencies of each env.

    Samples go into a ``deque`` per env: recording is on the path of every call
    that waited, and a deque append costs a tenth of writing a numpy element.
    A sample whose call was queued is one ``complex`` number, the env's own
    time plus the queue wait times ``1j``: one object per sample either way.
    Samples shared by many envs (a worker's whole group, every step) are only
    listed as they come, and spread into the envs' deques in batches: touching
    every env's deque on every step costs more than the step's other
    bookkeeping.  An env's deque is made with its first sample: an empty one
    takes 0.75 KB, a third of aiovec's memory per env at 100,000 envs that
    never wait (docs/performance.md).
    """

    def __init__(self, num_envs: int, window: int = 256) -> None:
        self._window = window
        self._samples: list[collections.deque[complex] | None] = [None] * num_envs
        self._shared: list[tuple[Collection[int], float]] = []  # not yet in the deques

    def _of(self, i: int) -> collections.deque[complex]:
        """Env ``i``'s deque, made now if it has none yet."""
        samples = self._samples[i]
        if samples is None:
            samples = self._samples[i] = collections.deque(maxlen=self._window)
        return samples

    def record(self, i: int, seconds: float, queued: float = 0.0) -> None:
        """Add one sample for env ``i``: its own ``seconds``, and those it was ``queued``."""
        if self._shared:
            self._spread()
        (self._samples[i] or self._of(i)).append(complex(seconds, queued) if queued else seconds)

    def record_many(self, envs: Collection[int], seconds: float) -> None:
        """Add the same sample for each env of ``envs`` (their calls ended together).

        ``envs`` is kept as it is until the samples are spread: it must not change.
        """
        shared = self._shared
        shared.append((envs, seconds))
        if len(shared) >= self._window:
            self._spread()

    def _spread(self) -> None:
        """Move the shared samples into each env's deque, in the order they came.

        Samples of the same envs are extended at once: all of each set of envs
        (by identity) if the sets come back and no two share an env (a
        pipelined loop alternates between its workers' groups), else each run
        of consecutive ones.
        """
        shared, self._shared = self._shared, []
        samples = self._samples
        by_envs: dict[int, tuple[Collection[int], list[float]]] = {}  # id(envs): all held here
        for envs, seconds in shared:
            found = by_envs.get(id(envs))
            if found is None:
                by_envs[id(envs)] = (envs, [seconds])
            else:
                found[1].append(seconds)
        sets = [envs for envs, _ in by_envs.values()]
        # Worth checking only when the sets come back (parts of many requests rarely do)
        repeated = len(sets) * 4 <= len(shared)
        if len(sets) == 1 or (repeated and len(set().union(*sets)) == sum(map(len, sets))):
            for envs, run in by_envs.values():
                for i in envs:
                    (samples[i] or self._of(i)).extend(run)
            return
        start = 0
        while start < len(shared):  # a run of samples of the same envs: extended at once
            envs = shared[start][0]
            stop = start + 1
            while stop < len(shared) and (shared[stop][0] is envs or shared[stop][0] == envs):
                stop += 1
            run = [seconds for _, seconds in shared[start:stop]]
            for i in envs:
                (samples[i] or self._of(i)).extend(run)
            start = stop

    def summary(self) -> LatencyStats:
        """Percentiles per env and overall, of the envs' own times and of their queue waits."""
        self._spread()
        own = np.full((len(self._samples), self._window), np.nan)
        queued = own.copy()
        for i, samples in enumerate(self._samples):
            if samples:
                values = np.asarray(samples, dtype=np.complex128)
                own[i, : len(samples)] = values.real
                queued[i, : len(samples)] = values.imag
        count = np.array([len(s) if s else 0 for s in self._samples], dtype=np.int64)
        return _stats(count, own, _stats(count, queued))

    def clear(self) -> None:
        """Forget every sample."""
        self._shared.clear()
        self._samples = [None] * len(self._samples)


def _stats(count: np.ndarray, table: np.ndarray, queue: LatencyStats | None = None) -> LatencyStats:
    """Percentiles of ``table`` (one row of samples per env, NaN where none) per env and overall."""
    with warnings.catch_warnings():  # envs never timed are all-NaN rows: NaN is the answer
        warnings.simplefilter("ignore", RuntimeWarning)
        p50, p99 = np.nanpercentile(table, [50, 99], axis=1)
        mean = np.nanmean(table, axis=1)
    flat = table[~np.isnan(table)]
    overall = np.percentile(flat, [50, 99]) if flat.size else np.array([np.nan, np.nan])
    return LatencyStats(count, p50, p99, mean, float(overall[0]), float(overall[1]), queue)
