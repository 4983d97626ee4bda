"""The worker's side of the pool (process and Ray): parts that compose.

- ``envs.py``: `Envs`, a worker's envs and their step flows (built, stepped,
  called, rebuilt), and the drivers of a `GroupFlow`;
- ``rows.py``: `RowWriter`, the step rows a worker reads actions from and writes
  transitions into;
- ``jobs.py``: `Jobs`, the one job engine: steps and calls, async envs' calls
  as tasks, results published as envs end; every result leaves through a `Sink`;
- ``worker.py``: `Worker`, the three composed, and the one dispatch of requests
  (`Worker.handle`) that a worker process and a Ray actor share.

A worker process (``backends/process/child.py``) publishes through the
completion table; the Ray actor (``backends/ray/actor.py``) hands each reply
to the actor call that waits for it.
"""
