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

SUBCOMMANDS = (
    "predict",
    "advise",
    "simulate",
    "compare",
    "reproduce",
    "train",
    "bench",
    "launch",
    "store",
)
#: commands whose arguments after a script are the script's own
SCRIPT_COMMANDS = ("launch",)
#: commands that run torch: they get --threads torch threads
TORCH_COMMANDS = ("simulate", "compare", "advise", "reproduce", "train", "bench")


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; our contract is one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="tailtrain",
        description="Straggler-tolerant data-parallel training: predict, simulate, compare, train.",
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


#: options of `tailtrain` itself, before the command
TOP_OPTIONS = ("-h", "--help", "--version", "-v", "--verbose", "--threads")


def misplaced_option(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """A one-line error for an option given where it does not belong: a command's option
    before the command, or an option of another command after it; else None."""
    subs = dict(_subparsers(parser))
    command = None
    for token in argv:
        if token == "--":
            return None
        flag = token.split("=", 1)[0]
        if command is None:
            if token in SUBCOMMANDS:
                command = token
            elif token.startswith("-") and not _takes(TOP_OPTIONS, flag):
                owners = commands_with(parser, flag)
                if not owners:
                    return None
                return (
                    f"{flag} is an option of {', '.join(owners)}, not of tailtrain itself: "
                    f"put it after the command, e.g. tailtrain {owners[0]} {flag} ..."
                )
            continue
        if command in SCRIPT_COMMANDS:  # the script's own options follow: argparse checks ours
            return None
        if f"{command} {token}" in subs:
            command = f"{command} {token}"
        elif token.startswith("--"):
            known = [o for a in subs[command]._actions for o in a.option_strings]
            if not _takes(known, flag):
                return unknown_option_message(parser, command, [flag])
    return None


def _takes(options: Sequence[str], flag: str) -> bool:
    """Whether ``flag`` is one of ``options`` or an abbreviation argparse accepts."""
    return any(option.startswith(flag) for option in options) if len(flag) > 1 else False


def commands_with(parser: argparse.ArgumentParser, flag: str) -> list[str]:
    """The commands (and `simulate collectives`) that take option ``flag``."""
    found = []
    for name, sub in _subparsers(parser):
        if any(flag in action.option_strings for action in sub._actions):
            found.append(name)
    return found


def _subparsers(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + name, sub
                yield from _subparsers(sub, prefix + name + " ")


def unknown_option_message(
    parser: argparse.ArgumentParser, command: str, extras: Sequence[str]
) -> str:
    """One line for arguments the command does not take, naming who takes an option."""
    flag = next((e.split("=", 1)[0] for e in extras if e.startswith("-")), None)
    if flag is None:
        return f"unrecognized arguments: {' '.join(extras)}"
    owners = [name for name in commands_with(parser, flag) if name != command]
    if not owners:
        return f"{command} has no option {flag}"
    return f"{flag} is an option of {', '.join(owners)}, not of {command}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    wrong = misplaced_option(parser, argv)
    if wrong is not None:
        parser.error(wrong)
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = " ".join(filter(None, (args.command, getattr(args, "what", None))))
        parser.error(unknown_option_message(parser, command, extras))
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    try:
        if args.command in TORCH_COMMANDS:
            import torch  # only the simulator and the runtime need it; predict stays light

            torch.set_num_threads(args.threads)
        return int(args.run(args) or 0)
    except TailtrainError as exc:
        if str(exc):  # no message: another process (torchrun's rank 0) reports it
            print(f"tailtrain {args.command}: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt:
        print("tailtrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader (e.g. `| head`) left; silence the flush at exit as well
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
