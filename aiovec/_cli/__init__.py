"""aiovec's command line: ``python -m aiovec demo`` and ``python -m aiovec bench``.

- `demo`: network envs on the loopback game server, stepped
  one after another (as ``gymnasium.vector.SyncVectorEnv`` does) and through
  both of aiovec's front ends; a table of the speed-up.
- `bench`: a user's env factory (or a registry id) on every backend and
  several sizes; a table, a recommendation and optionally a plot; `factory`
  loads and probes what it measures.
- `report`: what both share: per-step timings (and the timed loop),
  plain-text tables and a progress bar on stderr.

Nothing here is public API except the commands themselves.
"""
