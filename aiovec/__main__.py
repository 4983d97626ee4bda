"""``python -m aiovec``: the ``demo``, ``bench`` and ``serve`` commands.

``python -m aiovec demo`` shows in one command why aiovec exists (network envs
stepped one after another, then together); ``python -m aiovec bench
MODULE:FACTORY`` measures your own env factory on every backend and says which
configuration is fastest; ``python -m aiovec serve MODULE:FACTORY`` serves
that env to ``aiovec.make("ws://HOST:PORT", num_envs)``.  The commands live in `aiovec._cli`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from aiovec._cli import bench, demo, serve

__all__ = ("main",)

INTERRUPTED = 130  # the shell's status for a command ended by SIGINT


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    parser = argparse.ArgumentParser(
        prog="python -m aiovec",
        description="aiovec: an asyncio vector env for reinforcement learning.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.add_parser(commands)
    bench.add_parser(commands)
    serve.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (130 after Ctrl-C)."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: python -m aiovec {args.command} stopped; "
            "every env, worker and server it started was closed",
            file=sys.stderr,
        )
        return INTERRUPTED
    return status


if __name__ == "__main__":
    raise SystemExit(main())
