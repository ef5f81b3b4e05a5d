"""Run records of a simulation: JSON Lines that ``pandas.read_json(path, lines=True)`` reads.

``steps.jsonl`` has one row per update: virtual time, k_t, mini-batch loss, the workers whose
gradients entered it and their staleness. ``evals.jsonl`` has the periodic evaluations and
``summary.json`` the run's summary.

A run streaming to a folder (``RecordSink``) appends each row as it comes and flushes it,
so a crash loses at most the step in flight; ``summary.json`` is replaced atomically. A folder
that already holds a run is never written over silently (``claim_folder``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from tailtrain.errors import UsageError


@dataclass
class RunRecord:
    """Everything a run produced, kept in memory and optionally written to a folder.

    What ``simulate``, ``train`` and ``train_own_model`` return: ``steps`` (one row per
    update), ``evals`` (the periodic evaluations) and the ``summary``. ``theta`` is the final
    parameters, flat, where a real run hands them back (``train``, ``train_own_model``: this
    rank's model); None from ``simulate`` and on a rank that holds no model (a parameter
    server's workers). It is never written to the run folder.
    """

    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    #: where rows go as they come (a run streaming to its folder); None: memory only
    sink: RecordSink | None = field(default=None, repr=False, compare=False)
    #: the final parameters, flat (see above); not part of what two records compare
    theta: np.ndarray | None = field(default=None, repr=False, compare=False)

    def add_step(self, row: dict[str, Any]) -> None:
        self.steps.append(row)
        if self.sink is not None:
            self.sink.write("steps", row)

    def add_eval(self, row: dict[str, Any]) -> None:
        self.evals.append(row)
        if self.sink is not None:
            self.sink.write("evals", row)

    def column(self, name: str) -> np.ndarray:
        return np.array([row[name] for row in self.steps])

    def write(self, folder: Path) -> None:
        folder = prepare_folder(folder)
        write_jsonl(folder / "steps.jsonl", self.steps)
        write_jsonl(folder / "evals.jsonl", self.evals)
        write_json(folder / "summary.json", self.summary)


#: the files of one run's record, and what else a simulate run keeps in its folder
RECORD_FILES = ("steps.jsonl", "evals.jsonl", "summary.json")
RUN_FILES = (*RECORD_FILES, "run.json", "checkpoint.pt")
#: what a real run (``train``) keeps beside them: drills fired, failures, the trace, the
#: parameter server's pid while it serves
TRAIN_EXTRA = (
    "drills.jsonl",
    "failures.jsonl",
    "trace.csv",
    "server.pid",
    "rank-steps.jsonl",
)


class RecordSink:
    """Appends rows to ``steps.jsonl`` and ``evals.jsonl`` as a run makes them, flushed.

    ``offsets`` (bytes per file, from ``offsets``) continues a record: each file is cut
    back to what it held then, so rows written after a checkpoint are not written twice.
    """

    NAMES = ("steps", "evals")

    def __init__(self, folder: Path, offsets: dict[str, int] | None = None) -> None:
        self.folder = Path(folder)
        self._files: dict[str, IO[str]] = {}
        for name in self.NAMES:
            path = self.folder / f"{name}.jsonl"
            if offsets is None:
                self._files[name] = path.open("w")
                continue
            size = path.stat().st_size if path.exists() else -1
            if size < offsets[name]:
                raise UsageError(
                    f"{path} holds less than its checkpoint says ({max(size, 0)} < "
                    f"{offsets[name]} bytes): it was changed; start the run again with --overwrite"
                )
            os.truncate(path, offsets[name])
            self._files[name] = path.open("a")

    def write(self, name: str, row: dict[str, Any]) -> None:
        fh = self._files[name]
        fh.write(json.dumps(clean(row)) + "\n")
        fh.flush()

    def offsets(self) -> dict[str, int]:
        """Bytes written to each file so far (everything is flushed)."""
        return {name: fh.tell() for name, fh in self._files.items()}

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as indented JSON, atomically: a reader sees the old file or the new."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(clean(value), indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def held_run(folder: Path, names: tuple[str, ...]) -> list[str]:
    """The entries of ``names`` that ``folder`` holds."""
    folder = Path(folder)
    return [name for name in names if (folder / name).exists()] if folder.is_dir() else []


def claim_folder(
    folder: Path, names: tuple[str, ...], *, overwrite: bool, resume_hint: bool
) -> Path:
    """``folder``, created, for a new run: refused if it holds one (``names``) unless
    ``overwrite``. Nothing is removed here: the run clears the old one as it starts
    (``clear_run``), once its input has been checked."""
    folder = prepare_folder(folder)
    held = held_run(folder, names)
    if held and not overwrite:
        how = f"continue it with --resume {folder}, " if resume_hint else ""
        raise UsageError(
            f"--out {folder} already holds a run ({held[0]}); {how}give a new folder, "
            "or add --overwrite to replace it"
        )
    return folder


def clear_run(folder: Path, names: tuple[str, ...]) -> None:
    """Remove a run's entries ``names`` from ``folder`` (never anything else there)."""
    for name in held_run(folder, names):
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


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
