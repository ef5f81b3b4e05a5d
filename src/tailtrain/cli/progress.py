"""The command line's console; its progress bar is :mod:`tailtrain.progress`'s."""

from __future__ import annotations

import os
import sys

from rich.console import Console

from tailtrain.progress import step_progress

__all__ = ["console", "step_progress"]


def console() -> Console:
    """Standard output, as wide as the terminal or $COLUMNS; 160 columns for a pipe or a file."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console()
    return Console(width=160)
