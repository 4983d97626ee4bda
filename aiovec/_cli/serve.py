"""``python -m aiovec serve MODULE:FACTORY``: serve envs to ``aiovec.make("ws://HOST:PORT", n)``.

The server (`aiovec._serve.server.Server`) runs on this process's main loop
(uvloop's where it is installed: a waiting env costs it less) until Ctrl-C or
SIGTERM, when it closes every session.  Once it accepts connections it prints
one line holding its URL (the real port when ``--port 0`` was asked); sessions
opened, resumed and closed are logged on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

from aiovec._cli.factory import FactoryError, load_factory
from aiovec.backends.process.child import new_loop

__all__ = ("add_parser",)

USAGE_ERROR = 2


def add_parser(commands: Any) -> None:
    """Register the ``serve`` command on an ``argparse`` sub-parser collection."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "serve",
        help="serve envs to aiovec.make('ws://HOST:PORT', num_envs) over one WebSocket",
        description=(
            "Serve the envs FACTORY builds: each session a client opens is one env, run on "
            "aiovec's BACKEND here. Clients: aiovec.make('ws://HOST:PORT', num_envs). "
            "Needs pip install 'aiovec[serve]'."
        ),
    )
    parser.add_argument("factory", metavar="MODULE:FACTORY", help="what builds one env")
    parser.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0: any)")
    parser.add_argument(
        "--backend",
        choices=("inline", "thread", "process"),
        default="inline",
        help="where the sessions' envs run (default: inline)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="the token clients must give (default: $AIOVEC_SERVE_TOKEN); "
        "needed for any address but a loopback one",
    )
    parser.add_argument("--num-workers", type=int, default=None, help="process: worker processes")
    parser.add_argument(
        "--resume-window",
        type=float,
        default=60.0,
        help="seconds a dropped client's sessions wait for it (default: 60)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; 2 when the arguments are refused."""
    try:
        from aiovec._serve.server import Server  # noqa: PLC0415  (the serve extra)
    except ModuleNotFoundError as exc:
        print(f'aiovec serve needs {exc.name}: pip install "aiovec[serve]"', file=sys.stderr)
        return USAGE_ERROR
    try:
        factory = load_factory(args.factory)
        server = Server(
            factory.make,
            host=args.host,
            port=args.port,
            backend=args.backend,
            token=args.token,
            num_workers=args.num_workers,
            resume_window=args.resume_window,
        )
    except (FactoryError, ValueError, TypeError) as exc:
        print(f"aiovec serve: {exc}", file=sys.stderr)
        return USAGE_ERROR
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    with asyncio.Runner(loop_factory=new_loop) as runner:  # uvloop's, where it is installed
        runner.run(_serve(server))
    return 0


async def _serve(server: Any) -> None:
    await server.start()
    print(f"aiovec serve: listening on {server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.aclose()
