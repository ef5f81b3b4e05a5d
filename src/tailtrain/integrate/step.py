"""A training-loop step for your own PyTorch loop: any allreduce strategy in a few lines.

    step = StragglerStep(model, optimizer, strategy="dropcompute:threshold=auto")
    for micro_batches in loader:                       # a list of M micro-batches per step
        record = step(micro_batches, lambda b: F.cross_entropy(model(b[0]), b[1]))

One call is one round of ``tailtrain.integrate.rounds``: the micro-batches are computed one at
a time while the threshold allows (``loss_fn(batch).backward()``, the plain loss, not divided
by M), then one weighted allreduce of ``[sum_n w_n G_n, sum_n w_n]`` over the model's
gradients, flattened into buckets of ``bucket_cap_mb`` (``runtime.reduce.Collectives``), whose
first bucket carries every rank's agreement row as ``train``'s round does (w_n from this rank's
own counts, checked against the rule's selection over all rows after it: ``agreed_average``;
a half-precision model's rows are gathered before it), then the closing gather of the round's
timings, and the optimizer steps on the result:

* H = 1 (``sync``, ``dropcompute``): G_n is rank n's mean gradient over its C_n counted
  micro-batches; the optimizer's gradient is ``lr_scale * sum_n w_n G_n / divisor``, which is
  DropCompute Eq. (1) for its weights w_n = C_n / M over N, and plain data-parallel SGD when
  nothing is dropped.
* H > 1 (``local-sgd:period=H``, DropCompute App. B.3): the optimizer takes a local step every
  M micro-batches (on the gradient sum over M), and the round ends with the weighted model
  average theta <- theta_0 + sum_n w_n P_n / divisor with P_n = (theta_n - theta_0) U / C_n,
  U = H M: the average of the local models when nobody dropped work, and for plain SGD
  exactly ``tailtrain train``'s update (``runtime.allreduce``).

``rebalance`` (give ``micro_batches=M``, sync's micro-batches per rank and step) deals sync's
global batch of N M micro-batches to the ranks by shares that follow their measured speed:
each call takes this rank's share, ``wants`` (and the returned record's
``wants``: the next call's), and [`ShareSampler`][tailtrain.ShareSampler] draws
exactly that many from your dataset, every sample once an epoch::

    step = StragglerStep(model, optimizer, "rebalance", micro_batches=M)
    sampler = ShareSampler(len(dataset), step, micro_batch_size=B)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for indices in sampler:                        # this rank's share of the step
            step([collate(dataset, i) for i in indices], loss_fn)

G_n is then the mean over the rank's m_n micro-batches and its weight m_n / M over N, so the
update is SGD on the whole global batch (``strategies.rebalance``).

``rebalance:deal=demand`` (``micro_batches=M``) deals no shares: each call takes the job's
STREAM of micro-batches indexed by position (``stream[i]``: a list, a map-style dataset; the
same i-th micro-batch on every rank), and the step's N M positions go to whichever rank asks
next, from the job's rendezvous store (``integrate.demand``, which ``ShardedStep`` shares), so
a slow rank computes fewer and none waits for a share it cannot finish. The record's ``dealt``
names each rank's positions, ``state_dict`` keeps the stream's place, and ``close()``, on
every rank after the last call, lets the store's keys go::

    step = StragglerStep(model, optimizer, "rebalance:deal=demand", micro_batches=M)
    for _ in range(steps):
        step(stream, loss_fn)                          # the positions this rank asks for
    step.close()

A rank whose gradient holds a NaN or an infinity joins with weight 0, as ``train`` does;
under a ``scaler`` (``torch.amp.GradScaler``, for float16 autocast) it joins as it is, as in
DDP's allreduce: each micro-batch's loss is scaled before its backward, and the optimizer
steps through ``scaler.step`` and ``scaler.update``, so an overflow on any rank skips the
update on every rank and halves every rank's scale (refused with Local-SGD's local steps).
A round in which no rank's gradient entered (every rank stopped before its first micro-batch,
or every one was screened out: the record's ``empty``) makes no update: the optimizer does not
step, so momentum or weight decay move nothing (under H > 1 the parameters return to the
round's start), as ``train``'s parameters stay (``topology.allreduce.step_row``).
Ranks start from rank 0's parameters and buffers (broadcast once, as DDP does).

Under a [`StragglerProbe`][tailtrain.StragglerProbe] that watches the step
(``probe.watch(step)``, then ``for micro_batches in probe.batches(loader): step(...)``), a
call runs its round's collectives (the weighted allreduce with the agreement in it, the
closing gather) inside ``probe.sync()``: the probe counts them as this rank's wait and the
micro-batches and the optimizer's step as its compute, and takes the samples of the
micro-batches computed as the step's ``samples``.

**Losing a rank** (``on_rank_loss="shrink"``, under ``tailtrain launch --on-rank-loss shrink``,
``runtime.launching.scripts``; the default ``"stop"`` leaves a dead rank's peers failing in
their next collective, as DDP's do). Every collective of a call is watched
(``runtime.elastic.group``: ``Watch``, the learned ``Deadline`` over the seconds from one
call's end to the next, so the loop's own work between calls counts; at most ``timeout``). When
a rank dies or stays silent past the deadline, the survivors run ``train``'s protocol, the same
``Shrinker``, through the loop's part in it (``integrate.membership``): CENSUS, FORMING (a
fresh gloo group, generation g + 1, over the launcher's store), SYNCING from the lead survivor,
the one that completed the most rounds (the lowest rank among equals): the model's
``state_dict``, the optimizer's, the rule's (``state_dict``) and the deadline's rounds seen.
The rule follows the live world (``RuleDriver.followed``: ``Strategy.follow_world`` with the L
live ranks; a rule that cannot, ``Strategy.follow_refusal``, or one of per-rank shares, whose
redone round would need another draw from the loader, is refused in one line at construction;
``deal=demand`` is not: a redone round deals the same stream positions again).
No rank is special: the store lives in the launcher, so rank 0 may die too.

A call's round (``StepCall``, the states of a call) applies its update only after its
last collective (``Rounds.timing``), so a round is complete on a rank or not begun at all
there, and one rank is at most one round ahead of another. When a round breaks, the call:

* returns the lead's record of that round, when the lead completed it (every rank's
  gradient was in its allreduce: nothing lost, nothing counted twice);
* else computes it again among the survivors, from the same micro-batches, and returns
  that record (from the round's start, kept as it began: the model's buffers, which its
  forward passes moved, and local-SGD's parameters and optimizer state).

The first round completed after a shrink is the one the lead broke in, computed again: its
record says ``redone=True`` and names the ranks ``lost``, on every survivor alike.

So the loop does not change: one call, one record, ``record.step`` the call's index; the
dead rank's shard is skipped (the same per-rank batch: the global batch is the L live ranks'
batches), except dealt on demand, where the survivors deal the whole pool of N M positions
among themselves (the global batch kept; ``integrate.demand``), and ``record.live`` says whose
``completed`` and ``weights`` these are. A rank that
hung past the deadline and woke is not taken back: its call raises
``Refused`` (the survivors went on without it), and
the launcher logs that it left. After a shrink the default process group is broken: leave
the loop without collectives of your own (``dist.destroy_process_group()`` is fine).

**Healing** (``tailtrain launch ... --restart-lost N``): a rank that died is started again with
``TAILTRAIN_RESTART`` in its environment; its script skips ``dist.init_process_group`` (the
job's group is broken), or calls ``tailtrain.init_process_group`` in its place (a stand-in
default group of its job rank, ``integrate.default_group``, for a ``DistributedSampler``), and
its ``StragglerStep`` skips rank 0's broadcast: it asks to join (JOINING, ``join``) in the
constructor. The lowest member looks for requests (``joins_waiting``) before a call's last
gather (``Rounds.timing``'s ``asks`` column), so every member learns it in the same call and,
after that call's round completed (a step boundary), GROWS (``grow``): generation g + 1 of the
members and the joiner, synced from the lead as after a shrink (``LoopMembership.sync``: model,
optimizer, rule state and the stream's place, deadline, latest record). The joiner's constructor
returns then, and its loop goes on from ``next_step``; every rank's next record names it
(``record.rejoined``). A rank that asks after the first rank finished is refused (the launcher
sets ``finished``) and leaves. A pause of one rank between two calls longer than the learned
deadline (at least 1 s) reads as a hang: evaluate on every rank, or not between calls.
"""

from __future__ import annotations

import copy
import datetime
import logging
import math
import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from tailtrain.errors import UsageError
from tailtrain.integrate.average import (
    agreed_average,
    buckets,
    carries_rows,
    grad_of,
    weighted_average,
)
from tailtrain.integrate.demand import StreamDeal, check_store, open_dealer
from tailtrain.integrate.membership import LoopMembership, StepCall
from tailtrain.integrate.probe import batch_samples, watching
from tailtrain.integrate.rounds import (
    RoundProgress,
    Rounds,
    StepRecord,
    as_strategy,
    check_micro_batches,
)
from tailtrain.runtime.elastic.group import Broken
from tailtrain.runtime.elastic.refusals import check_on_rank_loss
from tailtrain.runtime.elastic.shrink import OnRankLoss, Shrinker
from tailtrain.runtime.elastic.store import REJOIN
from tailtrain.runtime.reduce import Collectives, PeerFailure
from tailtrain.strategies.base import Strategy
from tailtrain.strategies.entries import LOOP

log = logging.getLogger(__name__)

#: DDP's default bucket size
BUCKET_CAP_MB = 25.0
#: what a call deals beyond the allreduce protocol (``Strategy.needs``): per-rank shares and
#: the pool on demand, as ``strategies.entries.LOOP`` declares it for ``advise --for loop``
DEALS = LOOP.does


class StragglerStep:
    """Runs one round per call on ``process_group`` (None: the default group).

    ``timeout`` bounds each of its collectives (None: the group's own timeout). Every call
    returns the round's ``StepRecord`` (who took part, with which weight, under which tau).
    ``micro_batches`` is sync's M, which ``rebalance`` needs (module docstring).
    ``on_rank_loss="shrink"`` goes on without a rank that dies or hangs (module docstring;
    under ``tailtrain launch --on-rank-loss shrink``); ``"stop"``, the default, does not.
    ``scaler``: a ``torch.amp.GradScaler`` for float16 autocast (module docstring).
    ``max_grad_norm``: clip the gradient of every optimizer step to this total norm
    (``torch.nn.utils.clip_grad_norm_``, after the scaler unscaled it; a local step's too),
    as a loop clips between its backward and its step.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        strategy: str | Strategy = "dropcompute",
        *,
        process_group: dist.ProcessGroup | None = None,
        timeout: datetime.timedelta | None = None,
        bucket_cap_mb: float = BUCKET_CAP_MB,
        micro_batches: int | None = None,
        on_rank_loss: str = "stop",
        scaler: torch.amp.GradScaler | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        # a wrong strategy is refused before any collective
        strategy = check_micro_batches(as_strategy(strategy, DEALS), micro_batches)
        self.max_grad_norm = checked_max_grad_norm(max_grad_norm)
        if scaler is not None and not scaler.is_enabled():  # GradScaler(enabled=False)
            scaler = None  # it scales nothing and steps as the optimizer: the screen stays
        if scaler is not None and strategy.averages_models:
            raise UsageError(
                f"{strategy.describe()} takes local optimizer steps and averages the models: a "
                "GradScaler's per-rank skips would leave the local models apart; give no scaler "
                "(bfloat16 autocast needs none) or an allreduce rule"
            )
        #: scales each micro-batch's loss, and steps the optimizer (``scaler.step``)
        self.scaler = scaler
        demand = check_store(strategy)
        self.model = model
        self.optimizer = optimizer
        self.params = [p for p in model.parameters() if p.requires_grad]
        device = self.params[0].device
        # started again by ``tailtrain launch --restart-lost``: the job's group is broken and
        # this rank is in none; it joins the live ranks' generation (module docstring)
        rejoining = on_rank_loss == OnRankLoss.SHRINK and os.environ.get(REJOIN) == "1"
        if rejoining:
            rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            comm = Collectives(rank, size, device, timeout=timeout)
        else:
            comm = Collectives.of_group(process_group, device, timeout)
        lr = float(optimizer.param_groups[0]["lr"])
        shrinks = check_on_rank_loss(
            on_rank_loss, strategy, process_group, comm, lr, rejoining=rejoining, deals_again=True
        )
        self.rounds = Rounds(strategy, comm, lr=lr, micro_batches=micro_batches, does=DEALS)
        self.buckets = buckets(self.params, bucket_cap_mb)
        #: dealt on demand: this rank's side of the deal (``integrate.demand``), the stream's
        #: place in ``rounds.stream``; None under any other rule
        self.deal: StreamDeal | None = None
        if demand:  # a rank started again is in no group: it opens its dealer alone
            dealer = open_dealer(None, comm, timeout, "StragglerStep", alone=rejoining)
            self.deal = StreamDeal(self.rounds, dealer, None, self, "StragglerStep")
        if not rejoining:  # a rank started again takes the lead's state as it joins
            broadcast_from_first(model, process_group)
        #: this rank's part in the elastic layer (None: ``on_rank_loss="stop"``):
        #: ``integrate.membership``
        self.membership: LoopMembership | None = None
        #: the state of the call in flight (``StepCall``)
        self.call = StepCall.COMPLETED
        #: where the round in flight started, which a break puts back so that a redone round
        #: moves it once: the model's buffers (a forward moves BatchNorm's statistics before
        #: any collective) and, under local steps, the parameters and the optimizer's state
        self._start: (
            tuple[list[torch.Tensor] | None, dict[str, Any] | None, list[torch.Tensor]] | None
        ) = None
        if shrinks:  # a rank started again asks to join here, before its first call
            self.membership = LoopMembership.start(
                self.rounds, model, optimizer, timeout, rejoining=rejoining, scaler=scaler
            )
            self._regrouped()

    @property
    def shrinker(self) -> Shrinker | None:
        """The shrink protocol's part of this rank (None: ``on_rank_loss="stop"``)."""
        return None if self.membership is None else self.membership.shrinker

    @property
    def last(self) -> StepRecord | None:
        """The latest record under ``on_rank_loss="shrink"`` (None before the first, and
        under ``"stop"``)."""
        return None if self.membership is None else self.membership.last

    def __call__(self, micro_batches: Sequence[Any], loss_fn: Callable[[Any], torch.Tensor]):
        """One round over ``micro_batches``; returns its ``StepRecord``. Under
        ``on_rank_loss="shrink"`` a round a lost rank broke is the lead's or redone (module
        docstring)."""
        # dealt on demand: the stream, indexed by position (``integrate.demand``), not listed
        batches = micro_batches if self.deal is not None else list(micro_batches)
        membership = self.membership
        if membership is None:
            return self._dealt_round(batches, loss_fn)
        while True:
            self.call = StepCall.IN_FLIGHT
            try:
                record = self._dealt_round(batches, loss_fn, shrinks=True)
            except (Broken, PeerFailure) as exc:
                self.call = StepCall.BROKEN
                broken = membership.shrinker.generation
                if self.deal is not None:  # before the census: no waiter on a stale round
                    self.deal.broke(broken)
                taken = self._shrink(exc)
                self._regrouped(broken, in_flight=taken is None)
                if taken is None:  # nobody completed it: compute it again among the survivors
                    self.call = StepCall.REDONE
                    continue
                self.call = StepCall.TAKEN
                return taken
            self.call, self._start = StepCall.COMPLETED, None
            record = membership.completed(record)
            if membership.grows:  # a rank asked to join: every member takes it in here
                broken = membership.shrinker.generation
                membership.heal()
                self._regrouped(broken, in_flight=False)
            return record

    def _dealt_round(
        self, batches: Any, loss_fn: Callable[[Any], torch.Tensor], shrinks: bool = False
    ) -> StepRecord:
        """``_round``; dealt on demand, a round that fails outside the elastic layer (the
        loop's own error, or any error without ``shrinks``) spends its store counters, and
        the step refuses further calls (``integrate.demand``)."""
        try:
            return self._round(batches, loss_fn)
        except UsageError:  # refused before any deal or collective: nothing spent
            raise
        except BaseException as exc:
            lost = shrinks and isinstance(exc, (Broken, PeerFailure))  # the shrink deals again
            if self.deal is not None and not lost:
                self.deal.broken = True
                self.deal.fail()
            raise

    def _regrouped(self, broken: int | None = None, in_flight: bool = False) -> None:
        """Dealt on demand, after a regroup (or this rank's join: ``broken`` None) out of
        generation ``broken``: the dealer's keys of the broken round go with a later tidy, and
        the lowest live rank that was a member before tidies (rank 0 may be gone; a rank
        taken in knows none of the rounds before it: ``integrate.demand``)."""
        if self.deal is None:
            return
        assert self.membership is not None
        live, joined = self.rounds.live, set(self.membership.joined)
        keepers = [r for r in live if r not in joined] or list(live)
        lowest = live[self.rounds.comm.rank] == keepers[0]
        if broken is None:  # this rank joined: no round of its own was in flight
            assert self.deal.dealer is not None
            self.deal.dealer.tidy = lowest
        else:
            self.deal.regrouped(broken, in_flight, lowest)

    def _round(self, batches: Any, loss_fn: Callable[[Any], torch.Tensor]) -> StepRecord:
        """One round; its update is applied only after its last collective (module
        docstring), so a round that breaks has changed nothing but what ``_start`` keeps (its
        buffers, local steps' state), which a break puts back. Dealt on demand ``batches`` is
        the stream (``integrate.demand``)."""
        deal = self.deal
        plan, m = self.rounds.plan(0 if deal is not None else len(batches))
        local = plan.local_steps > 1
        start = [p.detach().clone() for p in self.params] if local else None
        if self.membership is not None:  # a redo starts again from here
            kept = copy.deepcopy(self.optimizer.state_dict()) if local else None
            self._start = (start, kept, [b.detach().clone() for b in self.model.buffers()])
        self.optimizer.zero_grad(set_to_none=True)
        work, pending, dealt = RoundProgress(np.empty(0)), 0, None
        computed: int | None = 0  # samples of the micro-batches computed (None: not known)
        if deal is not None:  # one local step: the plan of a pool dealt on demand has one
            generation = 0 if self.membership is None else self.membership.shrinker.generation
            computed, dealt = deal.compute(batches, loss_fn, plan, work, generation, self._backward)
        else:
            for u, batch in enumerate(self.rounds.units(batches, plan, work)):
                loss = loss_fn(batch)
                self._backward(loss)
                work.loss_sum += float(loss.detach())
                pending += 1
                size = batch_samples(batch)
                computed = None if computed is None or size is None else computed + size
                if local and (u + 1) % m == 0 and u + 1 < len(batches):  # a local step ends
                    self._local_step(m)
                    pending = 0
        if local and pending:
            self._local_step(m)
        # a probe watching this step (``StragglerProbe.watch(step)``) times the round's
        # collectives as this rank's wait, the rest of the call as its compute
        probe = watching(self)
        with probe.sync() if probe is not None else nullcontext():
            mine, scale = self._contribution(work, start)
            # the agreement rides in the allreduce (agreed_average); a half-precision
            # model's is gathered first, outside the reduce's seconds (T^c)
            agreed = None if carries_rows(mine) else self.rounds.agree(work, plan, dealt)
            began = self.rounds.clock()
            screen = self.scaler is None  # an overflow must reach the scaler
            with torch.no_grad():
                if agreed is None:
                    averaged, screened, total, agreed = agreed_average(
                        self.rounds, self.buckets, mine, scale, work, plan, dealt, screen
                    )
                else:
                    averaged, screened, total = weighted_average(
                        self.rounds.comm, self.buckets, mine, scale, agreed, screen=screen
                    )
            reduce = self.rounds.clock() - began
            # the lowest member looks for ranks asking to join (at most every JOIN_LOOK
            # seconds) and says so in the round's last gather, so every member grows after
            # the same round
            asks = self.membership is not None and self.membership.asks()
            timing = self.rounds.timing(reduce, work, screened, asks)
        if probe is not None:
            probe.note_samples(computed)
            m = self.rounds.micro_batches or len(work.times)  # dealt on demand: M is given
            probe.note_remedy(self.rounds.strategy.describe(), m)
        if self.membership is not None:
            self.membership.grows = bool(timing[:, 3].any())
        with torch.no_grad():  # past the last collective: the round completes here
            overflowed = self._apply(averaged, start, plan.lr_scale, total)
        positions = None
        if deal is not None:  # past the round's collectives: its keys may go
            deal.leave()
            positions = deal.positions(agreed, int(sum(plan.shares)))
        record = self.rounds.finish(plan, work, agreed, timing, positions)
        return replace(record, overflowed=True) if overflowed else record

    def _shrink(self, exc: BaseException) -> StepRecord | None:
        """The broken round's start put back (its buffers, local steps' state), then the
        survivors' regroup (``LoopMembership.broke``): the lead's record of this rank's round
        when the lead completed it, else None (the round is computed again)."""
        membership = self.membership
        assert membership is not None
        if self._start is not None:  # the broken round's buffers and local steps: its start
            params, state, kept = self._start
            with torch.no_grad():
                for b, s in zip(self.model.buffers(), kept, strict=True):
                    b.copy_(s)
                for p, s in zip(self.params, params or [], strict=params is not None):
                    p.copy_(s)
            if state is not None:
                self.optimizer.load_state_dict(state)
            self._start = None
        return membership.broke(exc)

    @property
    def wants(self) -> int | None:
        """Micro-batches the next call computes on this rank: its share under ``rebalance``;
        None under any other rule (as many as you give)."""
        return self.rounds.wants()

    @property
    def shares(self) -> tuple[int, ...] | None:
        """Every rank's micro-batches in the next call (``rebalance``), summing to N M; None
        under any other rule, and dealt on demand (a rank takes what it asks for). Every rank
        holds the same (the rule's state is agreed)."""
        plan = self.rounds.rule.plan()
        return None if plan.on_demand else plan.shares

    def close(self) -> None:
        """Dealt on demand: after the last call, on every rank (a barrier), the last rounds'
        store keys go and the dealer's waiter ends. Nothing to do under any other rule."""
        if self.deal is not None:
            self.deal.close()

    @property
    def micro_batches(self) -> int | None:
        """Sync's M, as given (``micro_batches=``)."""
        return self.rounds.micro_batches

    @property
    def next_step(self) -> int:
        """The index of the next call's round (``record.step`` of its record): 0 at first; a
        rank started again (``tailtrain launch --restart-lost``) learns the live ranks' here
        once it joined, and its loop goes on from it: ``for i in range(step.next_step, S)``."""
        return self.rounds.step

    @property
    def rank(self) -> int:
        """This rank's index in the live group (its job rank until a shrink)."""
        return self.rounds.comm.rank

    @property
    def world_size(self) -> int:
        """The live world: the job's ranks less those a shrink went on without."""
        return self.rounds.comm.world_size

    @property
    def live(self) -> tuple[int, ...]:
        """The job's ranks that step now, in order."""
        return self.rounds.live

    def _backward(self, loss: torch.Tensor) -> None:
        """A micro-batch's backward: of the loss the scaler scaled, if there is one."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def _local_step(self, m: int) -> None:
        local_step(self.optimizer, self.params, m, self.max_grad_norm)

    def _contribution(
        self, work: RoundProgress, start: list[torch.Tensor] | None
    ) -> tuple[list[torch.Tensor], float]:
        """What this rank reduces and its scale: G_n's sum and 1 / C_n (H = 1), or P_n's
        displacement and U / C_n (H > 1; module docstring)."""
        done, units = work.done, len(work.times)
        if start is None:  # G_n: the mean gradient of the counted micro-batches
            return [grad_of(p) for p in self.params], 1.0 / max(done, 1)
        moved = [p.detach() - s for p, s in zip(self.params, start, strict=True)]
        return moved, units / max(done, 1)  # P_n: the displacement per counted unit, times U

    def _apply(
        self,
        averaged: list[torch.Tensor],
        start: list[torch.Tensor] | None,
        lr_scale: float,
        total: float,
    ) -> bool:
        """The optimizer's step on the average (H = 1), or the model average (H > 1); none
        where no rank's gradient entered (``total`` = sum_n w_n = 0: module docstring).
        Whether the scaler skipped the step (the average held an overflow)."""
        if start is None:
            if total == 0:  # no gradient entered: no update (module docstring)
                return False
            for p, avg in zip(self.params, averaged, strict=True):
                p.grad = avg
            if self.max_grad_norm is not None:  # the mean gradient's norm, unscaled
                if self.scaler is not None:
                    self.scaler.unscale_(self.optimizer)  # its step then does not again
                torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            for p in self.params:
                p.grad.mul_(lr_scale)
            if self.scaler is None:
                self.optimizer.step()
                return False
            # skipped on every rank where the sum holds an overflow, and then the scale backs
            # off: the public sign of a skip (as accelerate's ``optimizer_step_was_skipped``)
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return self.scaler.get_scale() < before
        for p, s, avg in zip(self.params, start, averaged, strict=True):
            p.copy_(s + lr_scale * avg)
        return False

    # ---- checkpoints (PyTorch's convention; the process group is left out) -----------------
    def state_dict(self) -> dict[str, Any]:
        """The rule's state (``strategy.state_dict``) and the round count, dealt on demand the
        stream's place; save the model, the optimizer and the scaler as usual, beside it."""
        return self.rounds.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds.load_state_dict(state)


def checked_max_grad_norm(max_grad_norm: float | None) -> float | None:
    """``max_grad_norm`` as given, or a one-line ``UsageError``: a finite norm > 0 (None: no
    clipping)."""
    if max_grad_norm is not None and not 0 < max_grad_norm < math.inf:
        raise UsageError(f"max_grad_norm must be a finite norm > 0, got {max_grad_norm}")
    return max_grad_norm


def local_step(
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.Tensor],
    m: int,
    max_grad_norm: float | None = None,
) -> None:
    """Local-SGD: theta_n <- optimizer step on (1/M) sum of the step's gradients, clipped to
    ``max_grad_norm`` if given."""
    for p in params:
        if p.grad is not None:
            p.grad.div_(m)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def broadcast_from_first(module: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Every rank starts from the first rank's parameters and buffers (as DDP does)."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, group=group, group_src=0)


__all__ = ["StepRecord", "StragglerStep"]
