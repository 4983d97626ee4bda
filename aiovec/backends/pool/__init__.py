"""The pool: envs grouped on workers, whatever carries the requests (process and Ray).

- ``pool.py``: `Pool`, the backend itself: who hosts each env, calls cut into
  one request per worker, cancel, deaths, rebuild, close;
- ``table.py``: `WorkTable`, the pool's state table (pure: no loop, no
  transport): what each env waits on, stuck calls, blocked workers, lost envs;
- ``transport.py``: `Transport`, the protocol a transport implements
  (``backends/process/``, ``backends/ray/``), and what both share of a
  group's life;
- ``messages.py``: every message between the parent and a worker, as typed values;
- ``host/``: a worker's side, shared by a worker process and a Ray actor.
"""
