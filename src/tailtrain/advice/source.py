"""What ``advise`` reads: a trace file, or a folder holding one (a probe's or a run's)."""

from __future__ import annotations

from pathlib import Path

from tailtrain.errors import UsageError

#: the trace a folder holds: the probe's and ``tailtrain train``'s (all ranks) ``trace.csv``
FOLDER_TRACE = "trace.csv"


def trace_file(path: str | Path) -> Path:
    """``path`` itself, or ``path/trace.csv`` when ``path`` is a folder."""
    path = Path(path)
    if not path.is_dir():
        return path
    found = path / FOLDER_TRACE
    if not found.is_file():
        raise UsageError(
            f"folder {str(path)!r} holds no {FOLDER_TRACE}: give a probe's or a run's folder "
            "(StragglerProbe(out=...), tailtrain train --out) or the trace file itself"
        )
    return found
