"""`tailtrain compare` (not yet built)."""

from __future__ import annotations

import argparse

from tailtrain.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare (not yet available)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    raise UsageError("'compare' is not available yet")
