"""Run records of a simulation: JSON Lines that ``pandas.read_json(path, lines=True)`` reads.

``steps.jsonl`` has one row per update: virtual time, k_t, mini-batch loss, the workers whose
gradients entered it and their staleness. ``evals.jsonl`` has the periodic evaluations and
``summary.json`` the run's summary.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tailtrain.errors import UsageError


@dataclass
class RunRecord:
    """Everything a run produced, kept in memory and optionally written to a folder."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def add_step(self, row: dict[str, Any]) -> None:
        self.steps.append(row)

    def add_eval(self, row: dict[str, Any]) -> None:
        self.evals.append(row)

    def column(self, name: str) -> np.ndarray:
        return np.array([row[name] for row in self.steps])

    def write(self, folder: Path) -> None:
        folder = prepare_folder(folder)
        write_jsonl(folder / "steps.jsonl", self.steps)
        write_jsonl(folder / "evals.jsonl", self.evals)
        (folder / "summary.json").write_text(json.dumps(clean(self.summary), indent=2) + "\n")


def prepare_folder(folder: Path) -> Path:
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out {folder} is a file; give a folder path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out folder {folder}: {exc.strerror}") from None
    return folder


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(clean(row)) + "\n")


def clean(value: Any) -> Any:
    """JSON has no NaN or numpy types: map NaN/inf to null and numpy to Python."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return clean(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
