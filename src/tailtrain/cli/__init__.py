"""The `tailtrain` command line. Each subcommand lives in its own module with
``register(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from tailtrain import __version__
from tailtrain.errors import TailtrainError

SUBCOMMANDS = ("predict", "simulate", "compare", "reproduce")


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; our contract is one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="tailtrain",
        description="Straggler-tolerant data-parallel training: predict, simulate, compare.",
    )
    parser.add_argument("--version", action="version", version=f"tailtrain {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: simulated models are small, and more threads "
        "mostly contend)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    sub.required = True
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"tailtrain.cli.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    try:
        if args.command in ("simulate", "compare", "reproduce"):
            import torch  # only the simulator needs it; predict stays light

            torch.set_num_threads(args.threads)
        return int(args.run(args) or 0)
    except TailtrainError as exc:
        print(f"tailtrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tailtrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader (e.g. `| head`) left; silence the flush at exit as well
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
