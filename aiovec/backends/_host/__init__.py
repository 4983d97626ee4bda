"""The worker's side of the grouped backends (process and Ray): parts that compose.

- ``envs.py``: `Envs`, a worker's envs and their step flows (built, stepped,
  called, rebuilt), and the drivers of a `GroupFlow`;
- ``rows.py``: `RowWriter`, the step rows a worker reads actions from and writes
  transitions into;
- ``jobs.py``: `Jobs`, the one job engine: steps and calls, async envs' calls
  as tasks, results published as envs end; every reply leaves through a `Sink`;
- ``worker.py``: `Worker`, the three composed, and the one dispatch of requests
  (`Worker.handle`) that a worker process and a Ray actor share;
- ``child.py``: a worker process: its entry point, its serving loop and the
  sink that writes to its reply pipe.

The Ray actor (``backends/_ray_actor.py``) wraps a `Worker` too; its sink
hands each reply to the actor call that waits for it.
"""
