"""How the parameter server keeps its run (``runtime.ps``, module docstring: Checkpoints):
the snapshot of a closed step, going on from one, and the record a resumed server streams to.
The server is the run's only state; its workers keep nothing."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tailtrain.core import envelope
from tailtrain.core.records import prepare_folder
from tailtrain.runtime.keep import reopen_records
from tailtrain.runtime.telemetry import ScoredLater, attach

if TYPE_CHECKING:
    from tailtrain.runtime.ps.state import ServerState


def open_record(server: ServerState, saved: dict[str, Any] | None) -> None:
    """Rows stream as steps close (module docstring): to a fresh ``steps.jsonl``, or to
    the folder's cut back to the rows ``saved`` counts; evaluations wait to be scored."""
    if server.config.out is not None:
        counts = None if saved is None else {"steps": int(saved["rows"]["steps"]), "evals": 0}
        last = None if saved is None else next(iter(envelope.step_tail(saved)[-1:]), None)
        sink, rows = reopen_records(prepare_folder(server.config.out), counts, last)
        attach(server.record, sink)
        server.record.steps = rows["steps"]
    if server.record.sink is not None:
        server.record.sink = ScoredLater(server.record.sink)
    if saved is None:
        return
    for row in envelope.eval_tail(saved):  # scored at the end, as the others
        server.record.add_eval(row)
    pending = envelope.pending(saved)
    if pending is not None:  # LGC: a restart waits for no straggler's blocks
        server.record.add_step(pending)


def state_dict(server: ServerState) -> dict[str, Any]:
    """The server's envelope after a closed step (``core.envelope``): the rule, the update
    (LGC's deferred term), the evaluator and every evaluation row so far (unscored: scored at
    the end), where the record stands; its parts: the model versions in force (by reference:
    an update makes a new one), the unscored snapshots, each worker's next job number (its
    data and delay draws: ``ps_worker``) and the token queue. The workers keep nothing: a
    resumed server gives each a new job at its next number."""
    steps, evals = server.record.steps, server.record.evals
    return envelope.seal(
        step=server.step,
        now=server.now,
        rule=server.rule.state_dict(),
        update=server.update.state_dict(),
        evals=server.evals,
        rows=envelope.rows_at(len(steps), steps[-1:], len(evals), evals),
        pending=server.pending.row if server.pending is not None else None,
        version=server.version,
        versions=list(server.versions),
        thetas=list(server.versions.values()),
        snapshots=list(server.snapshots),
        next_job=server.next_job.tolist(),
        tokens=[list(run) for run in server.schedule.tokens],
        ghosts=server.ghosts,
    )


def resume(server: ServerState, saved: dict[str, Any]) -> None:
    """Go on from :func:`state_dict`'s checkpoint; the clock goes on from its ``now``."""
    server.step, server.version = int(saved["step"]), int(saved["version"])
    server.now = float(saved["now"])
    server.versions = dict(zip(saved["versions"], saved["thetas"], strict=True))
    envelope.unseal(saved, rule=server.rule, update=server.update, evals=server.evals)
    server.snapshots = list(saved["snapshots"])
    server.next_job = np.array(saved["next_job"], dtype=np.int64)
    # every worker starts afresh (none computes for a resumed server); the token queue goes on
    tokens = tuple((int(version), int(count)) for version, count in saved["tokens"])
    server.schedule = replace(server.schedule, version=server.version, tokens=tokens)
    server.ghosts = int(saved["ghosts"])
