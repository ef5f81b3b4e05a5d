"""TensorBoard scalars of a run, from the same step and evaluation rows as the run record.

One adapter serves every producer of rows: ``simulate`` logs a finished run record, and a
training loop can call :meth:`TensorBoardLog.add_step` and :meth:`TensorBoardLog.add_eval` as
rows appear. The x-axis ``step`` is the number of updates applied (a step row's index + 1, the
evaluation rows' own ``step``), and each event's wall time is the row's virtual time, so
TensorBoard's *Relative* axis reads virtual seconds since the start of the run.

tensorboard is an optional dependency: ``pip install tailtrain[tensorboard]``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from tailtrain.errors import UsageError

INSTALL_HINT = "pip install tailtrain[tensorboard]"
#: step-row keys logged as they are, and their tags (where a row has them)
STEP_KEYS = {
    "loss": "train/minibatch_loss",
    "k": "strategy/k",
    "lr": "train/lr",
    "threshold": "strategy/threshold_tau",
    "drop_rate": "strategy/drop_rate",
    "nap": "strategy/nap",
    "quorum": "strategy/quorum",
}
#: evaluation-row keys and their tags; ``eval`` is tagged by the run's metric
EVAL_KEYS = {"train_loss": "eval/train_loss", "eval_loss": "eval/test_loss"}


def step_scalars(row: Mapping[str, Any], previous_time: float) -> dict[str, float]:
    """The finite scalars of one step row, by tag; ``previous_time`` is when the update began
    (the previous row's time, 0 for the first), giving the iteration time."""
    scalars = {tag: row.get(key) for key, tag in STEP_KEYS.items()}
    scalars["time/iteration"] = row["time"] - previous_time
    scalars["time/virtual"] = row["time"]
    staleness = row.get("staleness")
    if staleness:
        scalars["strategy/mean_staleness"] = sum(staleness) / len(staleness)
    return finite(scalars)


def eval_scalars(row: Mapping[str, Any], metric: str) -> dict[str, float]:
    """The finite scalars of one evaluation row; ``metric`` names its ``eval`` value."""
    scalars = {tag: row.get(key) for key, tag in EVAL_KEYS.items()}
    scalars[f"eval/test_{metric}"] = row.get("eval")
    return finite(scalars)


def finite(scalars: Mapping[str, Any]) -> dict[str, float]:
    """Numbers only: a missing value, a flag or an infinite threshold is left out."""
    return {
        tag: float(value)
        for tag, value in scalars.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def check_tensorboard(folder: Path) -> None:
    """Raise a one-line UsageError unless events can be written to ``folder``."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--tensorboard {folder} is a file; give a folder path")
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        raise UsageError(f"--tensorboard needs the tensorboard package: {INSTALL_HINT}") from None


class TensorBoardLog:
    """A ``SummaryWriter`` fed with run-record rows; use it as a context manager."""

    def __init__(self, folder: Path, metric: str = "eval") -> None:
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"--tensorboard {folder} is a file; give a folder path")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UsageError(
                f"--tensorboard needs the tensorboard package: {INSTALL_HINT}"
            ) from None
        self.writer = SummaryWriter(log_dir=str(folder))
        self.metric = metric
        self.last_time = 0.0

    def add_step(self, row: Mapping[str, Any]) -> None:
        """Log a step row at step = updates applied, wall time = the row's virtual time."""
        self._add(step_scalars(row, self.last_time), row["step"] + 1, row["time"])
        self.last_time = row["time"]

    def add_eval(self, row: Mapping[str, Any]) -> None:
        self._add(eval_scalars(row, self.metric), row["step"], row["time"])

    def add_record(self, steps: Iterable[Mapping], evals: Iterable[Mapping]) -> None:
        """A whole run, its rows in order of virtual time as a live run would log them."""
        tagged = heapq.merge(
            ((row["time"], 0, row) for row in steps),
            ((row["time"], 1, row) for row in evals),
            key=lambda item: item[:2],
        )
        for _, is_eval, row in tagged:
            if is_eval:
                self.add_eval(row)
            else:
                self.add_step(row)

    def add_scalars(self, scalars: Mapping[str, float], step: int, time: float) -> None:
        """Log any finite scalars by tag (a probe's per-rank scores) at ``step``, ``time``."""
        self._add(finite(scalars), step, time)

    def _add(self, scalars: Mapping[str, float], step: int, time: float) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step, walltime=time)

    def close(self) -> None:
        self.writer.close()

    def __enter__(self) -> TensorBoardLog:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
