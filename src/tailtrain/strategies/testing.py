"""Hand-made arrivals for testing rules (ours or a user's) without an engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from tailtrain.strategies.base import ArrivalColumns, Selection


class ArrivalRow(NamedTuple):
    """One arrival: worker w's gradient of model ``version``; its job number is the version."""

    worker: int
    version: int
    start: float
    finish: float
    units: float = 1.0
    partial: bool = False


def arrivals(rows: Sequence[ArrivalRow | tuple]) -> ArrivalColumns:
    """The rows as ``ArrivalColumns``, keyed (worker, version): one arrival per worker and
    version, as in a parameter-server step."""
    if not rows:
        return ArrivalColumns.empty()
    full = [ArrivalRow(*r) for r in rows]
    cols = [np.array(c) for c in zip(*full, strict=True)]
    worker, version, start, finish, units, partial = cols
    return ArrivalColumns(worker, version, version, start, finish, units, partial)


def weights(selection: Selection, cols: ArrivalColumns) -> tuple[np.ndarray, np.ndarray]:
    """The normalised ``now`` and ``later`` weights laid out along ``cols`` (0 where none)."""
    return selection.now.over(cols.keys), selection.later.over(cols.keys)
