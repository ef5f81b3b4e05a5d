"""How a `tailtrain train` run is kept: its folder, checkpoints, and what a failed group leaves.

The run folder is simulate's (``cli.run_folder``, ``core.records``, ``core.checkpoint``):
``run.json`` (the flags), ``steps.jsonl`` and ``evals.jsonl`` (rank 0 appends each row as it
comes and flushes it, so a crash loses at most the round in flight), ``summary.json`` at the
end and ``checkpoint.pt``, written atomically (a temporary file, then a rename) and read with
``weights_only=True``. Train adds ``drills.jsonl``: the kill and freeze drills that fired,
each noted before it fires, so that a drill fires once per run and not again after a restart
(``runtime.inject`` keeps that ledger); and ``failures.jsonl``: each failure of the group as
the survivors saw it (the round in flight, the missing ranks, the round the checkpoint holds,
the restart count), so the rounds a failure cost, in flight minus checkpointed, can be counted
afterwards.

**Checkpoints.** A rank keeps a snapshot of its state after every completed round (its
``state`` callable: references to the parameters, which an update replaces and never changes
in place, and copies of the small rest). Rank 0 writes it every ``--checkpoint-every`` rounds.
When the group fails, the survivors take a census in the rendezvous store (each checks in
with the round it completed last, then waits :data:`CENSUS_WAIT` seconds); the ranks that did
not check in are the missing ones, and the lowest surviving rank among those that completed
the most rounds writes its snapshot: a checkpoint of the last completed round, whichever rank
died. It also leaves a note for the launcher (``config.report``): the round in flight, the
missing ranks and the checkpoint, from which ``launch`` writes its one line.

A rank that starts with a checkpoint in ``--out`` goes on from it: a ``--resume``, a restart by
the elastic agent (``--max-restarts``) or by torchrun. Its records are cut back to the rows the
checkpoint counts (rows of rounds after it are played again) and appended to.

**Stopping and Ctrl-C** (``runtime.interrupt``). A rank the launcher stops (SIGTERM) takes
its census and saves before it exits, and ignores SIGTERM once it handles a failure. After
Ctrl-C, which each topology takes at a step boundary, the lead rank keeps the run
(:func:`keep_interrupted`): every finished row is already in ``steps.jsonl``, the summary is
written marked ``"partial": true``, the checkpoint of the last completed step is kept for
``--resume``, and a note beside the launcher's (:data:`INTERRUPTED_NOTE`) gives the launcher
its one line (:func:`interrupted_line`), which it raises as
``runtime.interrupt.Interrupted``: exit status 130, as ``simulate``'s.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from tailtrain.core import checkpoint
from tailtrain.core.records import RecordSink, RunRecord, write_json
from tailtrain.core.session import RunKeeper, run_identity
from tailtrain.errors import TailtrainError, UsageError
from tailtrain.runtime.interrupt import (
    Stopped,
    hold_sigterm,
    interrupt_requested,
    interrupted_by_user,
)
from tailtrain.strategies.base import Strategy

if TYPE_CHECKING:  # an annotation only: the scenario loads scipy, which a launcher need not
    from tailtrain.core.scenario import World

log = logging.getLogger(__name__)

#: one line per failure of the group: the round in flight, the missing ranks, the checkpoint
FAILURES = "failures.jsonl"
#: seconds the survivors of a failure wait for each other to check in
CENSUS_WAIT = 4.0
#: how a restarted group's ranks know which incarnation they are (torch elastic sets it)
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
#: the lead rank's note of an interrupted run, beside the launcher's ``report`` note
INTERRUPTED_NOTE = "interrupted.json"


class MissingRanks(TailtrainError):
    """Peers stopped answering; the message names them and the round in flight."""


def restarts(env: Any = os.environ) -> int:
    return int(env.get(RESTART_COUNT, "0") or 0)


# ---- the record, continued ---------------------------------------------------------------------
def head(path: Path, count: int) -> tuple[list[dict[str, Any]], int]:
    """The first ``count`` rows of a JSON Lines file (fewer if it holds fewer) and the byte
    offset after them. Nulls are read back as NaN, as the rows held them in memory."""
    rows: list[dict[str, Any]] = []
    offset = 0
    if not path.exists():
        return rows, 0
    with path.open("rb") as fh:
        for line in fh:
            if len(rows) == count or not line.endswith(b"\n"):
                break
            rows.append(_nan(json.loads(line)))
            offset += len(line)
    return rows, offset


def _nan(value: Any) -> Any:
    if value is None:
        return math.nan
    if isinstance(value, list):
        return [_nan(v) for v in value]
    if isinstance(value, dict):
        return {k: _nan(v) for k, v in value.items()}
    return value


def reopen_records(
    folder: Path, counts: dict[str, int] | None, last_step: dict[str, Any] | None
) -> tuple[RecordSink, dict[str, list[dict[str, Any]]]]:
    """Rank 0's sink: a fresh record (``counts`` None), or the folder's cut back to the rows a
    checkpoint counts; also the rows kept. The last step row travels in the checkpoint: the
    rank that wrote it may have outlived rank 0 by that row."""
    if counts is None:
        return RecordSink(folder), {name: [] for name in RecordSink.NAMES}
    rows, offsets = {}, {}
    for name in RecordSink.NAMES:
        rows[name], offsets[name] = head(folder / f"{name}.jsonl", counts[name])
    missing = {name: counts[name] - len(rows[name]) for name in RecordSink.NAMES}
    if missing["evals"] or missing["steps"] > (last_step is not None):
        raise UsageError(
            f"{folder}: steps.jsonl or evals.jsonl holds fewer rows than its checkpoint counts "
            f"({counts}); it was changed: start the run again with --overwrite"
        )
    sink = RecordSink(folder, offsets)
    if missing["steps"]:
        assert last_step is not None
        sink.write("steps", last_step)
        rows["steps"].append(last_step)
    return sink, rows


# ---- checkpoints and the failure census --------------------------------------------------------
@dataclass
class Snapshot:
    """A rank's state after ``step`` completed rounds (``core.checkpoint`` containers)."""

    step: int
    data: dict[str, Any]


class Keeper:
    """One rank's part in keeping the run (module docstring). ``run``: the run's keeper
    (``core.session.RunKeeper``: its folder, identity and when a checkpoint is due);
    ``report``: the launcher's note file."""

    def __init__(self, run: RunKeeper, rank: int, world: int, report: Path | None = None) -> None:
        self.run, self.rank, self.world, self.report = run, rank, world, report
        self.folder, self.every, self.identity = run.folder, run.every, run.identity
        self.snapshot: Snapshot | None = None
        #: the completed steps of the checkpoint in ``folder``, once this run wrote one
        self.checkpointed: int | None = None
        self.saved = self._load()

    @classmethod
    def of(cls, config: Any, world: World, strategy: Strategy, rank: int, ranks: int) -> Keeper:
        """The keeper of rank ``rank`` of ``ranks`` in a `train` run (``TrainConfig``)."""
        run = RunKeeper(
            run_identity(strategy, world),
            folder=config.out,
            every=config.checkpoint_every,
            clock="wall",
            faults=config.faults,
        )
        return cls(run, rank, ranks, config.report)

    @property
    def path(self) -> Path | None:
        return None if self.folder is None else Path(self.folder) / checkpoint.FILENAME

    def _load(self) -> dict[str, Any] | None:
        path = self.path
        if path is None or not path.exists():
            return None
        saved = checkpoint.load(path)
        self.run.check(saved, self.folder)
        if self.rank == 0:
            log.warning("going on from %s at step %d", path, saved["step"])
        return saved

    def completed(self, step: int, state: Callable[[], dict[str, Any]], save: bool = True) -> None:
        """``step`` rounds are done: keep the snapshot, and write it when one is due."""
        if self.folder is None:
            return
        self.snapshot = Snapshot(step, state())
        if save and self.rank == 0 and self.run.due(step):
            self._save(self.snapshot)

    def save_due(self, written: int) -> int:
        """Rank 0 writes the latest snapshot once it passed a checkpoint due since the last
        write (``written`` rounds); returns the rounds the checkpoint on disk holds. For a
        topology that snapshots off its main thread and may skip a due round
        (``runtime.partial.rounds``)."""
        snapshot = self.snapshot
        if self.rank != 0 or snapshot is None or not self.run.due(snapshot.step, written):
            return written
        self._save(snapshot)
        return snapshot.step

    def finish(self, record: RunRecord) -> None:
        """The run is complete (rank 0): its summary, and no checkpoint left to resume from."""
        assert self.folder is not None
        self.run.close(record, partial=False)

    def interrupted(self, record: RunRecord | None, step: int) -> None:
        """Ctrl-C ended the run at ``step`` (module docstring): the lead rank writes the
        checkpoint of its last completed step, unless the census wrote a later one, and keeps
        the record (:func:`keep_interrupted`); the other ranks have nothing to keep."""
        if self.rank != 0 or record is None:
            return
        last = self.snapshot
        if last is not None and last.step > 0 and last.step > (self.checkpointed or 0):
            self._save(last)
        iterations = self.identity["scenario"].get("iterations")
        keep = {"report": self.report, "iterations": iterations}
        keep_interrupted(record, step, self.run, checkpoint=self.checkpointed, **keep)

    def _save(self, snapshot: Snapshot) -> None:
        assert self.path is not None
        checkpoint.save(self.path, {**self.identity, "step": snapshot.step, **snapshot.data})
        self.checkpointed = snapshot.step

    def failed(self, in_flight: int, exc: BaseException, timeout: float) -> BaseException:
        """The group failed during round ``in_flight``: census, checkpoint, note; returns the
        exception this rank should end with. SIGTERM is ignored from here on."""
        hold_sigterm()
        done = self.snapshot.step if self.snapshot is not None else 0
        store = _store()
        alive = census(store, done, self.rank, self.world, CENSUS_WAIT)
        if alive is None:  # a late rank (the census is closed) or no store: nothing to add
            return exc
        missing = sorted(set(range(self.world)) - set(alive))
        best = max(alive.values())
        if self.folder is not None and best > 0:  # the writer's, below or on another rank
            self.checkpointed = best
        if min(r for r, s in alive.items() if s == best) == self.rank and elected(store):
            self._write_failure(in_flight, missing, timeout)
        if missing and not isinstance(exc, Stopped) and _peer_failure(exc):
            who = ", ".join(map(str, missing))
            return MissingRanks(
                f"rank {who} did not answer at step {in_flight} within --timeout {timeout:g}s"
            )
        return exc

    def failed_alone(self, in_flight: int, timeout: float) -> None:
        """The rank that keeps the run alone (a parameter server's rank 0: its workers keep
        nothing) failed during step ``in_flight``: no census; it writes the checkpoint of its
        last completed step, the launcher's note and the run's row in failures.jsonl."""
        hold_sigterm()
        self._write_failure(in_flight, [], timeout)

    def _write_failure(self, in_flight: int, missing: list[int], timeout: float) -> None:
        """The writer's part: the checkpoint of its last round, the launcher's note and the
        run's row in failures.jsonl."""
        saved = None
        if self.snapshot is not None and self.snapshot.step > 0:
            self._save(self.snapshot)
            saved = self.snapshot.step
        note = {"step": in_flight, "missing": missing, "checkpoint": saved}
        note |= {"folder": None if self.folder is None else str(self.folder)}
        note |= {"timeout": timeout, "restart": restarts()}
        if self.report is not None:
            write_json(self.report, note)
        # a Ctrl-C is no failure: sure under SIGINT alone, whoever the census missed (a rank
        # that left on it first can miss it under load); under torchrun (SIGTERM asks too)
        # only when every rank checked in, since SIGTERM also stops a failure's survivors
        ctrl_c = interrupted_by_user() or (interrupt_requested() and not missing)
        if self.folder is not None and not ctrl_c:  # the run's own account of its failures
            with open(Path(self.folder) / FAILURES, "a") as file:
                file.write(json.dumps(note) + "\n")


# ---- Ctrl-C: keep what finished ----------------------------------------------------------------
def keep_interrupted(
    record: RunRecord,
    step: int,
    keeper: RunKeeper,
    *,
    report: Path | None,
    iterations: int | None,
    checkpoint: int | None,
) -> dict[str, Any]:
    """The lead rank after Ctrl-C at ``step`` (module docstring): ``record``'s summary marked
    partial and, with the run's folder, written there after the last rows by the run's
    ``keeper`` (``RunKeeper.close``, the checkpoint kept); the note the launcher's line comes
    from, beside ``report``; returns the note. ``checkpoint``: the completed steps the
    folder's checkpoint holds (None: none); ``iterations``: the run's budget, if counted."""
    record.summary["partial"] = True
    keeper.close(record, partial=True)
    if record.sink is not None:  # no folder: the keeper had nothing to close it into
        record.sink.close()
        record.sink = None
    folder = keeper.folder
    note = {"step": step, "of": iterations, "rows": len(record.steps), "checkpoint": checkpoint}
    note["folder"] = None if folder is None else str(folder)
    if report is not None:
        write_json(Path(report).with_name(INTERRUPTED_NOTE), note)
    return note


def read_interrupted(report: Path | None) -> dict[str, Any] | None:
    """The note :func:`keep_interrupted` left beside ``report``, or None."""
    return None if report is None else read_note(Path(report).with_name(INTERRUPTED_NOTE))


def interrupted_line(note: dict[str, Any] | None) -> str:
    """The one line of an interrupted run, from the lead rank's note (None: it left none,
    interrupted before its first step or while it started)."""
    if note is None:
        return "interrupted before the run kept a step; nothing kept"
    of = "" if note.get("of") is None else f" of {note['of']}"
    line = f"interrupted at step {note['step']}{of}"
    folder = note.get("folder")
    if folder is None:
        return f"{line}; kept nothing (no --out)"
    trace = " and trace" if (Path(folder) / "trace.csv").exists() else ""
    line = f"{line}; kept {note['rows']} steps, the summary (partial){trace} in {folder}"
    if note.get("checkpoint") is None:
        return f"{line}; no checkpoint to resume from"
    return f"{line}; {going_on(folder, 'resume with')}"


def going_on(folder: str | Path, verb: str) -> str:
    """How to go on from the checkpoint in ``folder``: ``tailtrain train --resume`` reads the
    run's flags from its run.json, which a run started from the library does not write."""
    if (Path(folder) / "run.json").exists():
        return f"{verb} `tailtrain train --resume {folder}`"
    return f"its checkpoint stays in {folder} (a library run: no run.json for --resume)"


def _peer_failure(exc: BaseException) -> bool:
    from tailtrain.runtime.reduce import PeerFailure

    return isinstance(exc, PeerFailure) or "timed out" in str(exc).lower()


def _store() -> dist.Store | None:
    """The rendezvous store of the census, or None when it cannot be reached."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception as exc:
        log.warning("no census of the ranks: %s", exc)
        return None


def census(
    store: dist.Store | None, step: int, rank: int, world: int, wait: float
) -> dict[int, int] | None:
    """Which ranks are alive, each with the rounds it completed: every rank that fails checks
    in to the rendezvous ``store`` and waits ``wait`` seconds for the others. None for a rank
    that comes after the census closed, or when the store cannot be reached."""
    if store is None:
        return None
    try:
        prefix = _prefix()
        if store.check([f"{prefix}/closed"]):
            return None
        store.set(f"{prefix}/{rank}", str(step))
        keys = [f"{prefix}/{r}" for r in range(world)]
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not store.check(keys):
            time.sleep(0.05)
        alive = {r: int(store.get(k)) for r, k in enumerate(keys) if store.check([k])}
        store.set(f"{prefix}/closed", "1")
        return alive
    except Exception as exc:  # the store went with the rank that hosted it
        log.warning("no census of the ranks: %s", exc)
        return None


def elected(store: dist.Store) -> bool:
    """Whether this rank, which its census names the writer, is the one writer of this
    incarnation's failure. Ranks that checked in around the census's close can see different
    alive sets, and so two of them can think they write: the first to claim the store's key
    writes, so the failure has one checkpoint, one note and one failures.jsonl row."""
    try:
        return store.add(f"{_prefix()}/writer", 1) == 1
    except Exception as exc:
        log.warning("no writer elected: %s", exc)
        return False


def _prefix() -> str:
    return f"tailtrain/census/{restarts()}"


def read_note(path: Path | None, restart: int | None = None) -> dict[str, Any] | None:
    """The survivors' note (:meth:`Keeper.failed`), or None; with ``restart``, only a note of
    that incarnation of the group (the launcher's last one): the note of an earlier failure,
    which a restarted group that failed again without a census left in place, is not this one's."""
    if path is None:
        return None
    try:
        note = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(note, dict):
        return None
    if restart is not None and note.get("restart", 0) != restart:
        return None
    return note


def resume_hint(folder: Path | None) -> str:
    """For a failure no survivor noted (a killed parameter server: its workers keep nothing):
    the checkpoint the run folder holds, if any, and how to go on from it."""
    path = None if folder is None else Path(folder) / checkpoint.FILENAME
    if path is None or not path.exists():
        return ""
    try:
        step = int(checkpoint.load(path)["step"])
    except (TailtrainError, KeyError, ValueError):
        return ""
    return f"; checkpoint of step {step - 1} in {folder}: {going_on(folder, 'continue with')}"


def describe(rank: int, text: str, signal_name: str | None, note: dict[str, Any] | None) -> str:
    """The launcher's one line for a failed job: who, at which step, and how to go on.

    ``rank``/``text``/``signal_name``: the first failure torch elastic saw; ``note``: what the
    survivors found (a rank that hung is not a failure to the agent: a survivor that timed out
    is, and names the missing rank in ``text``)."""
    if note is None:
        return f"rank {rank} failed: {text}"
    step, missing = note.get("step"), note.get("missing") or []
    if signal_name is not None:
        line = f"rank {rank} died at step {step} ({signal_name})"
    elif "MissingRanks" in text and missing:
        who = ", ".join(map(str, missing))
        timeout = note.get("timeout")
        line = f"rank {who} hung at step {step}: no answer within --timeout {timeout:g}s"
    else:
        line = f"rank {rank} failed at step {step}: {text}"
    folder, saved = note.get("folder"), note.get("checkpoint")
    if folder is None:
        return line
    resume = going_on(folder, "continue with")
    if saved is None:
        return f"{line}; no step completed: {resume}"
    return f"{line}; checkpoint of step {saved - 1} in {folder}: {resume}"
