"""The pure core of aiovec: every rule, no I/O.

Nothing in this package imports asyncio, anyio, threading, multiprocessing or
pickle.  Backends and front ends ask the core what each env does next and hand
it what came back; the rules (autoreset, infos, batching, seeding, validation,
lifecycle) are written here once.
"""
