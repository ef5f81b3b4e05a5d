"""A ``DistributedDataParallel`` job that loses a rank or a node and keeps going, and takes a
restarted one back: the DDP comm hook's state under ``tailtrain launch --on-rank-loss shrink``
(issue 37 item 6).

DDP holds its process group for good, and after a death that group is broken on every
survivor. So under shrink DDP's reducer stays idle: every forward of a round runs inside
``ddp_model.no_sync()`` (the gradients accumulate locally, as the hook's rounds already do),
and the state reduces the accumulated gradients itself over the elastic layer's live
generation (``runtime.elastic``: gen 0 is the job's default group, each later one a fresh gloo
group of the live ranks), with the weighted average ``StragglerStep`` runs
(``integrate.average.agreed_average``: sum_n w_n G_n / divisor, DropCompute Eq. (1), the
agreement riding in its first bucket; a half-precision model's gathered first), every
collective watched by the learned deadline. DDP touches its group only as it is built (its
shape check and its broadcast of rank 0's state) and in its first forward when it would
broadcast buffers, which is refused (``DDP(model, forward_sync_buffers=False)``: a broadcast
on each step would run over the broken group). The comm hook registered on the model stays as
``advise --for ddp`` prints it and is not called.

**A call** of ``state.micro_batches(ddp_model, micro_batches)`` (states: ``StepCall``):

* at its start, a step boundary (every member stepped its optimizer after the previous call):
  a rank that asked to join in the previous round is taken in (GROWING, ``LoopMembership``);
* ``SKIPPED``: in a rank started again, the calls before the live ranks' step yield nothing
  (its loop runs from its start, its unchanged ``DistributedSampler`` drawing the same
  batches as before; nothing is computed) and clear the gradients, so the loop's
  ``optimizer.step()`` moves nothing: the update of those steps is in the state it took;
  ``state.last.skipped`` and ``empty`` say so;
* ``IN_FLIGHT``: the micro-batches are yielded under ``no_sync`` while the threshold allows,
  then the round's collectives run: the weighted average carrying the agreement, and the
  closing gather (``Rounds.timing``), in which the lowest member says whether a rank asks to
  join. Past the closing gather the round is complete on this rank (``COMPLETED``): the
  averaged gradient, times ``lr_scale``, is written into the parameters' ``.grad`` for the
  loop's ``optimizer.step()``. Before it, the local gradients are untouched;
* ``BROKEN``: a collective failed or outlived the deadline; the survivors regroup
  (``LoopMembership.broke``). When the lead completed the round (``TAKEN``), this rank takes
  its state, whose update holds the round, returns its record, and clears the gradients
  (the loop's ``optimizer.step()`` moves nothing); otherwise (``REDONE``) the round is
  reduced again among the survivors from the same local gradients, the rule following the
  live world: nothing is computed twice.

Every rank's parameters are therefore equal after every call, whatever the loop does with
``state.last`` (the guard ``if not state.last.empty: optimizer.step()`` included). ``dist``'s
rank and world size stay the job's (a rank started again gets them from
``tailtrain.init_process_group``'s stand-in group, ``integrate.default_group``), so every
rank keeps its ``DistributedSampler`` shard: a dead rank's shard is not computed while it is
out, and the update averages the live ranks' (``record.live``). Every wait is the elastic
layer's: the learned deadline, the census window, or ``timeout``.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from tailtrain.errors import UsageError
from tailtrain.integrate.average import (
    agreed_average,
    buckets,
    carries_rows,
    grad_of,
    weighted_average,
)
from tailtrain.integrate.membership import LoopMembership, StepCall
from tailtrain.integrate.probe import batch_samples, watching
from tailtrain.integrate.rounds import RoundProgress, Rounds, StepRecord
from tailtrain.integrate.step import BUCKET_CAP_MB
from tailtrain.runtime.elastic.group import Broken
from tailtrain.runtime.reduce import PeerFailure
from tailtrain.strategies.entries import hook_refusal


def check_buffers(ddp_model: DistributedDataParallel) -> None:
    """A model whose buffers DDP broadcasts on each step is refused in one line (module
    docstring)."""
    # torch 2.13 reads forward_sync_buffers (broadcast_buffers before it)
    syncs = getattr(ddp_model, "forward_sync_buffers", ddp_model.broadcast_buffers)
    if syncs and next(ddp_model.module.buffers(), None) is not None:
        raise UsageError(
            "the DDP hook shrinks with a model whose buffers DDP would broadcast on each step "
            "over the job's group, broken after a death: build it with "
            "DDP(model, forward_sync_buffers=False) (each rank keeps its own; a heal hands "
            "the lead's over)"
        )


class ElasticRounds:
    """The hook state's rounds under shrink (module docstring): ``rounds`` on this rank,
    ``ddp_model``'s parameters and the ``optimizer`` a heal hands over."""

    def __init__(
        self,
        rounds: Rounds,
        ddp_model: DistributedDataParallel,
        optimizer: torch.optim.Optimizer,
        timeout: datetime.timedelta | None,
        *,
        rejoining: bool,
    ) -> None:
        check_buffers(ddp_model)
        self.rounds = rounds
        self.params = [p for p in ddp_model.module.parameters() if p.requires_grad]
        #: the reduce's buckets: the model's own order, the same on every rank whatever
        #: DDP's buckets are (a restarted rank's DDP never rebuilt them)
        self.groups = buckets(self.params, BUCKET_CAP_MB)
        #: the calls made on this rank (a rank started again skips those before
        #: ``rounds.step``)
        self.calls = 0
        self.call = StepCall.COMPLETED
        # a rank started again asks to join here, and returns with the live ranks' state
        self.membership = LoopMembership.start(
            rounds, ddp_model.module, optimizer, timeout, rejoining=rejoining
        )

    @property
    def last(self) -> StepRecord | None:
        return self.membership.last

    def round(self, ddp_model: DistributedDataParallel, batches: list[Any]) -> Iterator[Any]:
        """One call (module docstring): yields the micro-batches to compute; ``last`` is its
        record once the iteration ends."""
        membership, rounds = self.membership, self.rounds
        if membership.grows:  # a step boundary: every member takes the joiner in here
            membership.heal()
        if self.calls < rounds.step:  # a rank started again passes the steps already taken
            self.call = StepCall.SKIPPED
            self.membership.last = skipped(self.calls, len(batches))
            self.calls += 1
            clear(self.params)
            return
        plan, _ = rounds.plan(len(batches))
        if plan.local_steps > 1:  # a rule that did not declare it (``averages_models``)
            raise UsageError(hook_refusal(rounds.strategy, plan.local_steps))
        work = RoundProgress(np.empty(0))
        computed: int | None = 0  # samples of the micro-batches computed (None: not known)
        self.call = StepCall.IN_FLIGHT
        for batch in rounds.units(batches, plan, work):
            with ddp_model.no_sync():
                yield batch
            size = batch_samples(batch)
            computed = None if computed is None or size is None else computed + size
        probe = watching(ddp_model)  # times the round's collectives as this rank's wait
        with probe.sync() if probe is not None else nullcontext():
            self.reduce(len(batches), work)
        if probe is not None:
            probe.note_samples(computed)
            probe.note_remedy(rounds.strategy.describe(), len(batches))
        self.calls = rounds.step

    def reduce(self, units: int, work: RoundProgress) -> None:
        """The round's collectives until it completes on this rank or is the lead's (module
        docstring); the record is ``last``."""
        membership, rounds = self.membership, self.rounds
        while True:
            plan, _ = rounds.plan(units)  # after a regroup: the rule of the live world
            try:
                with torch.no_grad():
                    mine = [grad_of(p) for p in self.params]
                scale = 1.0 / max(work.done, 1)
                # the agreement rides in the allreduce; a half-precision model's is gathered
                # first, outside the reduce's seconds (T^c), as StragglerStep's
                agreed = None if carries_rows(mine) else rounds.agree(work, plan)
                began = rounds.clock()
                with torch.no_grad():
                    if agreed is None:
                        averaged, screened, _, agreed = agreed_average(
                            rounds, self.groups, mine, scale, work, plan
                        )
                    else:
                        averaged, screened, _ = weighted_average(
                            rounds.comm, self.groups, mine, scale, agreed
                        )
                reduce = rounds.clock() - began
                timing = rounds.timing(reduce, work, screened, membership.asks())
            except (Broken, PeerFailure) as exc:
                self.call = StepCall.BROKEN
                taken = membership.broke(exc)
                if taken is None:  # nobody completed it: reduce it again among the survivors
                    self.call = StepCall.REDONE
                    continue
                self.call = StepCall.TAKEN  # its update is in the lead's state
                clear(self.params)
                return
            membership.grows = bool(timing[:, 3].any())
            with torch.no_grad():  # past the last collective: the round completes here
                for p, avg in zip(self.params, averaged, strict=True):
                    p.grad = avg.mul_(plan.lr_scale)
            membership.completed(rounds.finish(plan, work, agreed, timing))
            self.call = StepCall.COMPLETED
            return


def clear(params: list[torch.Tensor]) -> None:
    """No gradient: an ``optimizer.step()`` moves nothing (torch's optimizers skip a
    parameter whose ``.grad`` is None, momentum and weight decay included)."""
    for p in params:
        p.grad = None


def skipped(step: int, units: int) -> StepRecord:
    """The record of a step a rank started again passed (``StepCall.SKIPPED``)."""
    nan = math.nan
    return StepRecord(
        step=step, threshold=nan, micro_batches=units, local_steps=1, completed=[], weights=[],
        ranks=[], loss=nan, drop_rate=nan, compute_time=0.0, comm_time=0.0, time=0.0,
        empty=True, skipped=True,
    )  # fmt: skip
