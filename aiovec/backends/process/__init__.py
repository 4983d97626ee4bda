"""``backend="process"``: CPU-bound envs in worker processes, several envs per worker.

The envs are split into W contiguous groups, one per worker process.  What
envs grouped on workers mean (who owns an env, cancel, a worker's death, lost
envs, rebuild, close) is the pool's (``backends/pool/``); this package is the
transport that carries its requests (`ProcessTransport`), in parts with one
job each:

- ``transport.py``: `ProcessTransport`, the parent's side: requests sent,
  outcomes taken in from the completion table, deaths;
- ``table.py``: `CompletionTable`, per env a request number and a done
  number in shared memory, and the rule of the doorbell;
- ``shared.py``: the shared files (the table, the step rows) and the doorbell;
- ``watch.py``: `Watch`, where the parent waits: the doorbell and each
  worker's death, from the loop or a parked ``poll``;
- ``link.py``: `Link`, one worker process and its pipes (started without the
  parent's main module);
- ``child.py``: a worker process: its serving loop and the sink that
  publishes its results in the table;
- ``wire.py``: message framing, and the one fixed-size request of a whole step.

The start method is `START_METHOD`; with ``"forkserver"`` the server preloads
aiovec's worker, so a worker starts in milliseconds.
"""

from __future__ import annotations

import os
import sys
from typing import ClassVar

from aiovec.backends.pool.pool import Pool
from aiovec.backends.process.transport import ProcessTransport

__all__ = ("START_METHOD", "ProcessBackend")

START_METHOD: str = os.environ.get("AIOVEC_START_METHOD") or (
    "forkserver" if sys.platform.startswith("linux") else "spawn"
)
"""The ``multiprocessing`` start method of new workers (read when a backend is built).

Set it with the ``AIOVEC_START_METHOD`` environment variable or by assigning
this attribute: ``"forkserver"`` (Linux default), ``"spawn"`` or ``"fork"``.
"""


class ProcessBackend(Pool):
    """Hosts envs in worker processes (the pool over `ProcessTransport`).

    ``backend_options``: ``{"cpus": [...]}`` pins worker ``k`` to CPU
    ``cpus[k % len(cpus)]`` (Linux); ``None`` lets the OS place every worker;
    ``"auto"`` (the default) pins them when there is one worker per usable
    CPU, and lets the OS place them otherwise.
    """

    OPTIONS: ClassVar[frozenset[str]] = frozenset({"cpus"})
    TRANSPORT = ProcessTransport

    @property
    def pids(self) -> tuple[int | None, ...]:
        """The process id of each worker (for diagnostics and tests)."""
        return self.transport.pids  # type: ignore[attr-defined,no-any-return]

    @property
    def shares_memory(self) -> bool:
        """Whether step data goes through the shared step rows (else it is pickled)."""
        return self.transport.shares_memory  # type: ignore[attr-defined,no-any-return]
