"""How the parameter server keeps its run (``runtime.ps``, module docstring: Checkpoints):
the snapshot of a closed step, going on from one, and the record a resumed server streams to.
The server is the run's only state; its workers keep nothing."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tailtrain.core import checkpoint
from tailtrain.core.records import prepare_folder
from tailtrain.core.session import RunKeeper
from tailtrain.runtime.keep import reopen_records
from tailtrain.runtime.telemetry import ScoredLater, attach

if TYPE_CHECKING:
    from tailtrain.runtime.ps.server import Server


def open_record(server: Server, saved: dict[str, Any] | None) -> None:
    """Rows stream as steps close (module docstring): to a fresh ``steps.jsonl``, or to
    the folder's cut back to the rows ``saved`` counts; evaluations wait to be scored."""
    if server.config.out is not None:
        counts = None if saved is None else {"steps": int(saved["rows"]), "evals": 0}
        last = None if saved is None else checkpoint.unpack(saved["last_step"])
        sink, rows = reopen_records(prepare_folder(server.config.out), counts, last)
        attach(server.record, sink)
        server.record.steps = rows["steps"]
    if server.record.sink is not None:
        server.record.sink = ScoredLater(server.record.sink)
    if saved is None:
        return
    for row in checkpoint.unpack(saved["evals"]):  # scored at the end, as the others
        server.record.add_eval(row)
    if saved["pending"] is not None:  # LGC: a restart waits for no straggler's blocks
        server.record.add_step(checkpoint.unpack(saved["pending"]))


def state_dict(server: Server) -> dict[str, Any]:
    """The server's state after a closed step: the model versions in force (by
    reference: an update makes a new one), the rule, the update (LGC's deferred term),
    the evaluator and the unscored snapshots, each worker's next job number (its data
    and delay draws: ``ps_worker``), the token queue, and where the record stands. The
    workers keep nothing: a resumed server gives each a new job at its next number."""
    steps = server.record.steps
    pending = server.pending.row if server.pending is not None else None
    return {
        "now": float(server.now),
        "version": server.version,
        "versions": list(server.versions),
        "thetas": list(server.versions.values()),
        "rule": server.rule.state_dict(),
        "update": server.update.state_dict(),
        "evaluator": RunKeeper.evaluator_state(server.evals),
        "evals": checkpoint.pack([dict(row) for row in server.record.evals]),
        "snapshots": list(server.snapshots),
        "next_job": server.next_job.tolist(),
        "tokens": [list(run) for run in server.schedule.tokens],
        "ghosts": server.ghosts,
        "rows": len(steps),
        "last_step": checkpoint.pack(steps[-1]) if steps else None,
        "pending": None if pending is None else checkpoint.pack(pending),
        "torch_rng": torch.get_rng_state(),
    }


def resume(server: Server, saved: dict[str, Any]) -> None:
    """Go on from :func:`state_dict`'s checkpoint; the clock goes on from its ``now``."""
    server.step, server.version = int(saved["step"]), int(saved["version"])
    server.now = float(saved["now"])
    server.versions = dict(zip(saved["versions"], saved["thetas"], strict=True))
    server.rule.load_state_dict(saved["rule"])
    server.update.load_state_dict(saved["update"])
    checkpoint.restore(server.evals, saved["evaluator"])
    server.snapshots = list(saved["snapshots"])
    server.next_job = np.array(saved["next_job"], dtype=np.int64)
    # every worker starts afresh (none computes for a resumed server); the token queue goes on
    tokens = tuple((int(version), int(count)) for version, count in saved["tokens"])
    server.schedule = replace(server.schedule, version=server.version, tokens=tokens)
    server.ghosts = int(saved["ghosts"])
    torch.set_rng_state(saved["torch_rng"])
