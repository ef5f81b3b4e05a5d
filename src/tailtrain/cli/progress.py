"""The command line's console; its progress bar is ``tailtrain.progress``'s.

Both load rich on first use: building the parser (``--help``, a bad flag) must not pay for it
(``tests/cli/test_cli_imports.py``)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from tailtrain.progress import step_progress

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["console", "step_progress"]


def console() -> Console:
    """Standard output, as wide as the terminal or $COLUMNS; 160 columns for a pipe or a file."""
    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console()
    return Console(width=160)
