"""LGC on the parameter server: the stragglers' blocks that make a step's deferred term.

When an LGC step closes (``partial_blocks`` s > 0), the workers busy at its version are its
stragglers; the server asks each for the blocks it finished (its interrupt), and each answers
with one PARTIAL (r of s blocks), or, with ``complete=true``, with its whole gradient. Once
every straggler reported, the rule is asked again on fresh + partial arrivals, in the state
before the step's ``adapt`` (its ``now`` must not change: checked), and its ``later`` weights
set e_t in the update path, which the update of step t + 1 adds (LGC Eqs. 6-7); the step's
row goes out then, with its ``partial_*`` columns (``runtime.ps.server``'s module docstring).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tailtrain.core.update import rows_weighed
from tailtrain.errors import TailtrainError
from tailtrain.runtime.ps.arrivals import Arrival, columns
from tailtrain.runtime.ps.state import Pending
from tailtrain.runtime.ps.wire import Message
from tailtrain.strategies.base import Selection, ServerPlan, Weighting

if TYPE_CHECKING:
    from tailtrain.runtime.ps.state import ServerState


def defer(
    server: ServerState,
    plan: ServerPlan,
    state: Any,
    fresh: list[Arrival],
    now: Weighting,
    row: dict,
) -> None:
    """Step t closed: wait for the blocks of its stragglers (none busy: resolve at once)."""
    stragglers = np.flatnonzero(server.busy == server.version).tolist()
    waiting = {w: (int(server.job[w]), float(server.start[w])) for w in stragglers}
    server.pending = Pending(
        state,
        fresh,
        now,
        waiting,
        server.version,
        server.now,
        row,
        plan.complete_stragglers,
        plan.partial_blocks,
    )
    if not waiting:
        resolve(server, server.pending)


def partial(server: ServerState, m: Message) -> None:
    """A straggler's PARTIAL: its r of s blocks, as a partial arrival of step t."""
    p = server.pending
    if m.worker in server.liveness.hung and (p is None or m.worker not in p.waiting):
        server.ghosts += 1  # a report given up on while its worker was suspected
        return
    if p is None or p.complete or p.waiting.get(m.worker, (None,))[0] != m.job:
        raise TailtrainError(f"worker {m.worker} reported blocks of job {m.job} unasked")
    units = m.units / m.blocks
    start = p.waiting[m.worker][1]
    a = Arrival(m.worker, m.job, p.version, start, p.close, m.payload, m.loss, units, True)
    report(server, p, m.worker, a)


def report(server: ServerState, p: Pending, w: int, a: Arrival) -> None:
    """Straggler ``w``'s work of step t; the last report resolves the step."""
    a.partial, a.version = True, p.version
    p.reports.append(a)
    del p.waiting[w]
    if not p.waiting:
        resolve(server, p)


def resolve(server: ServerState, p: Pending) -> None:
    """e_t from the rule's ``later`` weights over fresh + partial work (LGC Eq. 7)."""
    late = [a for a in p.reports if a.units > 0]  # r = 0: nothing to offer (as simulated)
    offered = p.fresh + late
    cands = columns(offered)
    selection = server.rule.select(cands, state=p.state)
    now = selection.now
    same = np.array_equal(now.keys, p.now.keys) and np.allclose(now.weight, p.now.weight)
    if not same or now.total != p.now.total:
        raise TailtrainError(
            f"{server.strategy.describe()}: its fresh weights changed with the partial work; "
            "the parameter-server runtime needs them independent of it"
        )
    index = rows_weighed(cands.keys, Selection(now=Weighting.none(), later=selection.later))
    if index.size:
        grads = torch.stack([offered[i].grad for i in index])
        later = Selection(now=Weighting.none(), later=selection.later)
        server.update.direction(grads, cands.keys[index], later)
    p.row["partial_workers"] = [a.worker for a in late]
    p.row["partial_units"] = [a.units for a in late]
    p.row["partial_jobs"] = [a.job for a in late]
    server.record.add_step(p.row)
    server.pending = None
