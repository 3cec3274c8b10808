"""The `fastnn` command (also `python -m fastnn`): `fastnn info` reports what fastnn finds on this machine;
`fastnn cache` shows the on-disk caches and `fastnn cache clear` empties them."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = argparse.ArgumentParser(prog="fastnn", description="fastnn: train neural networks fast on an NVIDIA GPU")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"fastnn {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("info", help="print versions, CUDA libraries, driver and GPU (paste it into bug reports)")
    cache = commands.add_parser("cache", help="show the on-disk caches (compiled kernels, decoded datasets); "
                                "`fastnn cache clear` empties them")  # fmt: skip
    cache.add_argument("action", nargs="?", choices=("info", "clear"), default="info",
                       help="info (the default): each cache's folder, size and bound; clear: remove their entries")
    args = parser.parse_args(argv)
    if args.command == "cache":
        from ._caches import clear_caches, report

        return clear_caches(sys.stdout) if args.action == "clear" else report(sys.stdout)
    if args.command == "info":
        from ._info import run_info

        try:
            return run_info()
        except BrokenPipeError:
            # The reader left (`fastnn info | head -1`): nothing to report. Python flushes stdout again at exit,
            # which would print the same error as "Exception ignored": point it at /dev/null first.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
