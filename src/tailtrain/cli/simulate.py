"""`tailtrain simulate` (not yet built)."""

from __future__ import annotations

import argparse

from tailtrain.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate (not yet available)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    raise UsageError("'simulate' is not available yet")
