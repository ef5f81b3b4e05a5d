"""Empirical compute times from a measured trace, resampled by bootstrap.

The CSV has a header row with columns ``iteration,worker[,micro_batch],seconds`` (any order).
Each row is one unit of work: one micro-batch when the ``micro_batch`` column is present,
otherwise one worker's whole iteration. The model is the empirical distribution of
``seconds``: sampling draws rows with replacement, cdf is the ECDF, mean and var are those of
the empirical distribution, and ``exact`` is False.
"""

from __future__ import annotations

import csv
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tailtrain.delays.atomic import AtomicDelay
from tailtrain.delays.base import FloatArray, Shape
from tailtrain.errors import UsageError
from tailtrain.spec import Spec

REQUIRED = ("iteration", "worker", "seconds")
OPTIONAL = ("micro_batch",)


@dataclass(frozen=True)
class Trace:
    """The columns of a trace file, one entry per row."""

    iteration: np.ndarray
    worker: np.ndarray
    micro_batch: np.ndarray | None
    seconds: FloatArray


class TraceDelay(AtomicDelay):
    """Bootstrap from the ``seconds`` of a trace (empirical, so ``exact`` is False)."""

    def __init__(self, spec: str, trace: Trace) -> None:
        super().__init__(spec, trace.seconds, 1.0)
        self.trace = trace
        self.per_micro_batch = trace.micro_batch is not None

    @property
    def exact(self) -> bool:
        return False

    def sample(self, rng: np.random.Generator, shape: Shape) -> FloatArray:
        return self.trace.seconds[rng.integers(0, self.trace.seconds.size, size=shape)]


def read_trace(path: str | Path) -> Trace:
    """Read and check a trace CSV; every problem is a one-line :class:`UsageError`."""
    path = Path(path)
    header = _read_header(path)
    columns = _check_columns(path, header)
    table = _read_numbers(path, len(header))
    _check_values(path, table, columns)
    column = {name: table[:, index] for name, index in columns.items()}
    return Trace(
        iteration=column["iteration"].astype(np.int64),
        worker=column["worker"].astype(np.int64),
        micro_batch=column["micro_batch"].astype(np.int64) if "micro_batch" in column else None,
        seconds=np.ascontiguousarray(column["seconds"]),
    )


def _read_header(path: Path) -> list[str]:
    try:
        with path.open(newline="") as handle:
            first = next(csv.reader(handle), None)
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise UsageError(f"cannot read trace file {str(path)!r}: {reason}") from None
    if not first:
        raise UsageError(
            f"trace file {str(path)!r} is empty: expected a header row "
            f"{','.join(REQUIRED[:2])}[,micro_batch],seconds"
        )
    return [name.strip() for name in first]


def _check_columns(path: Path, header: list[str]) -> dict[str, int]:
    expected = "iteration,worker[,micro_batch],seconds"
    unknown = [name for name in header if name not in REQUIRED + OPTIONAL]
    missing = [name for name in REQUIRED if name not in header]
    repeated = {name for name in header if header.count(name) > 1}
    for problem, names in (("unknown", unknown), ("missing", missing), ("repeated", repeated)):
        if names:
            raise UsageError(
                f"trace file {str(path)!r} has {problem} column(s) "
                f"{', '.join(sorted(names))}; expected columns {expected}"
            )
    return {name: header.index(name) for name in header}


def _read_numbers(path: Path, width: int) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "no data" is reported below
            table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2, dtype=np.float64)
    except ValueError:
        raise UsageError(_first_bad_row(path, width)) from None
    if table.shape[0] == 0:
        raise UsageError(f"trace file {str(path)!r} has a header but no rows")
    return table


def _first_bad_row(path: Path, width: int) -> str:
    """Find the row numpy rejected, to name it (only runs when the file is bad)."""
    with path.open(newline="", errors="replace") as handle:
        for line, row in enumerate(csv.reader(handle), start=1):
            if line == 1 or not row:
                continue
            if len(row) != width:
                return (
                    f"trace file {str(path)!r} line {line} has {len(row)} fields; "
                    f"the header has {width}"
                )
            for field in row:
                try:
                    float(field)
                except ValueError:
                    return (
                        f"trace file {str(path)!r} line {line}: {field.strip()!r} is not a number"
                    )
    return f"trace file {str(path)!r} is not a numeric CSV"


def _check_values(path: Path, table: np.ndarray, columns: dict[str, int]) -> None:
    for name, index in columns.items():
        values = table[:, index]
        bad = ~np.isfinite(values) | (values < 0)
        if name != "seconds":
            bad |= values != np.floor(values)
        if bad.any():
            row = int(np.argmax(bad))
            kind = "a finite number >= 0" if name == "seconds" else "an integer >= 0"
            raise UsageError(
                f"trace file {str(path)!r} data row {row + 1}: {name}="
                f"{values[row]:g} must be {kind}"
            )


def trace(spec: Spec) -> TraceDelay:
    """``trace:path=FILE``: bootstrap from the measured seconds in FILE."""
    spec.require_known(("path",))
    return TraceDelay(spec.text, read_trace(spec.get_str("path")))
