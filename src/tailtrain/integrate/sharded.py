"""A training-loop step for a sharded model (FSDP2): tailtrain's rule across replica groups.

    mesh = init_device_mesh("cuda", (R, S), mesh_dim_names=("replicate", "shard"))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["shard"])        # FSDP inside each group of S ranks
    fully_shard(model, mesh=mesh["shard"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step = ShardedStep(model, optimizer, "dropcompute:threshold=auto", mesh=mesh)
    for micro_batches in loader:                       # this rank's M micro-batches per step
        record = step(micro_batches, lambda b: F.cross_entropy(model(b[0]), b[1]))

Hybrid sharding (torchtitan's HSDP) shards the parameters within a group of S ranks and
replicates them across R groups. Within a group every rank must run the same number of forward
and backward passes (FSDP all-gathers the parameters layer by layer, and reduce-scatters the
gradients), so the unit that computes C_n micro-batches, is cut at tau, gets a weight or is
screened out is the **group**: the rule's N is R, and ``StepRecord.completed`` and ``weights``
are per group (``live``: the groups 0..R-1). Across groups the update is the weighted reduction
``[sum_n w_n G_n, sum_n w_n]`` that ``integrate.average`` makes (``weighted_average``), applied to
each rank's LOCAL gradient shard over the replicate dimension's process group: rank (n, s)
meets the ranks (n', s) of the other groups, 1/S of the model's bytes.

The model must be ``fully_shard``ed over the SHARD dimension only (``mesh[shard_dim]``); over
the 2-D mesh FSDP would all-reduce across the replicas itself, unweighted (refused in one
line). Ranks of a group are given different micro-batches, as in any FSDP job.

**The protocol** of one call (``Rounds`` decides, as for ``StragglerStep``; no rule here):

1. ``plan``: tau. Every rank holds the same rule state, so every rank gets the same plan.
2. Micro-batches: before each one, every rank asks ``Rounds.admit`` (DropCompute Algorithm 1
   on its own round clock), then the group agrees: one all_reduce(MAX) of the one-value flag
   "refused" over the shard group; if any rank of the group is refused, every rank of it stops
   there (``Rounds.stop`` on those that were admitted), so the group's C_n is the same on all
   its ranks and its compute ends when its first rank's tau is reached, as a group that is as
   slow as its slowest rank should. Each micro-batch is ``loss_fn(batch).backward()``, and FSDP
   reduce-scatters it within the group and accumulates the shard (its default: the local
   gradient after C micro-batches is sum_u (1/S) sum_s g_s^(u), the group's mean over ranks).
   Disabling that sync (``set_requires_gradient_sync(False)``) would need the last
   micro-batch known before it runs, which a cut at tau does not tell.
3. One all_reduce(SUM) over the shard group of [loss sum, gradient not finite]: the group's
   mean loss, and the group screens as one (a NaN in one rank's shard drops the whole group:
   its shards are one gradient).
4. ``Rounds.agree`` over the replicate group, through :class:`ReplicaCollectives`: each rank's
   row [C_n, T~_n, loss, t^(u)] is first reduced by MAX over the shard group (a group's time
   is its slowest rank's; C_n and the loss already agree), then gathered over the replicate
   group, so every rank of the job builds the same arrivals, selection and weights, and
   ``threshold=auto``'s Algorithm 2 sees the same times everywhere.
5. The weighted reduction over the replicate group on the local shards, each group's shard
   G_n = local gradient / C_n (``weighted_average``, buckets of ``bucket_cap_mb``); the
   optimizer's gradient is ``lr_scale * sum_n w_n G_n / divisor`` (DropCompute Eq. (1) with
   the group as the worker), written into each parameter's local shard, and
   ``optimizer.step()`` steps the sharded parameters (DTensors) as FSDP users expect.
6. ``Rounds.timing`` (again MAX within the group, gathered across groups) and ``finish``:
   ``adapt`` and the record, identical on every rank.

Under Local-SGD (``local-sgd:period=H``, DropCompute App. B.3) the optimizer takes a local
step on the group's sharded gradient every M micro-batches (the group's ranks at the same
micro-batch, since their counts agree: the group's model stays one model), and step 5 reduces
each shard's displacement instead: theta <- theta_0 + sum_n w_n P_n / divisor with
P_n = (theta_n - theta_0) U / C_n, U = H M, the average of the groups' models when none
dropped work (``integrate.step``'s rule, on the local shards).

**Cost** beyond plain HSDP with gradient accumulation: per micro-batch, while a finite tau is
in force (not under ``sync``, nor while ``threshold=auto`` calibrates), one all_reduce of one
float64 over the S ranks of the group, plus one when the group stops; per step, one
all_reduce of two values within the group, and two row gathers (each after a MAX all_reduce
of the row within the group) across groups: ~5 latency-bound collectives of a few hundred
bytes. The gradient's bytes are what HSDP moves: a reduce-scatter within the group per
micro-batch and one all_reduce of 1/S of the model across groups per step.

A round in which no group's gradient entered makes no update (the optimizer does not step),
as ``StragglerStep``. Ranks start from group 0's parameter shards (a broadcast over the
replicate group) and rank (0, 0)'s buffers.

Runs ``sync``, ``dropcompute`` (a fixed threshold, ``threshold=auto``, ``drop-rate=``),
``local-sgd:period=H`` and ``rebalance`` by shares (give ``micro_batches=M``, sync's
micro-batches per rank and step): the rule deals the R M micro-batches of a step to the
GROUPS by their measured speed (a group's unit time is its slowest rank's), and every rank
of group n computes its group's share m_n of its own micro-batches (``wants``), so the update
is SGD on the R S M micro-batches of the step.

**Dealt on demand** (``rebalance:deal=demand``, ``micro_batches=M``): the R M micro-batches of a
step go to whichever GROUP asks next, so a fast group computes more of them and no group waits
for a share it cannot finish. A call then takes this rank's STREAM, indexed by position
(``stream[i]``: a list, a map-style dataset of micro-batches; every group's rank s must give the
same i-th micro-batch, as the ranks (n, s) share the pool); a step deals the next R M positions,
the k-th ask taking the k-th of them. The group's first rank (shard 0) deals for it from the
job's rendezvous store (``integrate.demand``, which ``StragglerStep`` shares;
``runtime.dealer.Dealer``, env:// as torchrun sets it: ``MASTER_ADDR``, ``MASTER_PORT``): it
asks for a unit (the store's ask counter), and one all_reduce(MAX) over the shard group tells
its ranks which; after the unit it asks for the next the same way (every unit dealt counts, so
none is reported). A unit in flight here is the model's own forward and backward, which cannot
be cut, so the step deals the pool's R M units alone (``strategies.rebalance.deals``: racing one
past the pool, as ``train`` and ``simulate`` do, would end no step sooner) and every one of them
counts; the step ends at its last unit's completion. The record's ``dealt`` names each group's
positions, and ``state_dict`` keeps the stream's place. Per unit: one all_reduce of one value in
the group and one store round trip on its first rank, both the group's wait for a probe, as is a
group's wait for the others' last units (in the round's gather). A group that raises in a round
(its stream, its loss) sets the round's stop, so the other groups stop asking and meet the
failure in the round's gather, bounded by ``timeout``; the step then refuses further calls (the
round's counters are spent).

Every other rule is refused in one line for now: ``defer=true`` carries a threshold's cut
into shares the loop's data does not deal, K-of-N runs on the parameter server.

**Losing a rank** (``on_rank_loss="shrink"``, under ``tailtrain launch --on-rank-loss shrink``;
the default ``"stop"`` leaves a dead rank's peers failing in their next collective, as FSDP's
do). The worker is the replica group, and a group that loses a rank leaves whole: its other
ranks raise ``Refused`` (their launcher logs a leave), and the other groups go on with the
round in flight computed again among them (``record.redone``, ``record.lost`` the groups
lost, ``record.live`` the groups that step). The membership is the loop's elastic layer at
group granularity (``integrate.group_membership``): the census keeps whole groups, and each
round is applied only once the store decided that every member completed it
(``runtime.elastic.commit``), since its S replicate all-reduces can break apart. It runs
``sync``, ``dropcompute`` and ``local-sgd`` (rules of shares and deals are refused, as for
``StragglerStep``), on gloo and CPU tensors. After a shrink the mesh's replicate groups and
the default group are broken: leave the loop without collectives over them. A group started
again is not taken back (``--restart-lost`` is refused in one line).
"""

from __future__ import annotations

import copy
import datetime
import math
import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from tailtrain.errors import UsageError
from tailtrain.integrate.average import buckets, weighted_average
from tailtrain.integrate.demand import StreamDeal, check_store, open_dealer
from tailtrain.integrate.group_membership import GroupMembership, lost_peer
from tailtrain.integrate.membership import StepCall
from tailtrain.integrate.mesh import (
    ReplicaCollectives,
    check_mesh,
    check_sharded,
    local,
    local_grad,
    replica_groups,
    start_equal,
)
from tailtrain.integrate.probe import batch_samples, watching
from tailtrain.integrate.rounds import (
    RoundProgress,
    Rounds,
    StepRecord,
    as_strategy,
    check_micro_batches,
)
from tailtrain.integrate.step import BUCKET_CAP_MB, checked_max_grad_norm, local_step
from tailtrain.runtime.elastic.group import Broken
from tailtrain.runtime.elastic.refusals import check_on_rank_loss
from tailtrain.runtime.elastic.shrink import OnRankLoss
from tailtrain.runtime.elastic.store import REJOIN
from tailtrain.runtime.reduce import Collectives, PeerFailure
from tailtrain.strategies.base import AllreducePlan, Strategy
from tailtrain.strategies.entries import SHARDED
from tailtrain.strategies.registry import parse_strategy

MAX = dist.ReduceOp.MAX


def sharded_strategy(strategy: str | Strategy, micro_batches: int | None) -> Strategy:
    """``strategy`` if a sharded step runs it (``strategies.entries.SHARDED``, which ``advise
    --for fsdp`` asks too); one line otherwise, before any collective."""
    rule = parse_strategy(strategy) if isinstance(strategy, str) else strategy
    refusal = SHARDED.refusal(rule)
    if refusal is not None:
        raise UsageError(
            f"{refusal} (dropcompute: a fixed threshold, threshold=auto, drop-rate=; "
            "rebalance: shares or deal=demand)"
        )
    # the loop's contract (topology, compensations, what it deals: shares and the pool on
    # demand, not a threshold's cut carried by defer=true), and sync's M for a rule of shares
    return check_micro_batches(as_strategy(rule, SHARDED.does), micro_batches)


class ShardedStep:
    """Runs one round per call across the replica groups of ``mesh`` (module docstring).

    ``mesh`` is the 2-D ``DeviceMesh`` (replicate x shard) the model was ``fully_shard``ed
    on, over its shard dimension; ``replicate_dim`` names the other. ``timeout`` bounds each
    of the step's own collectives (None: the groups' own). Every call returns the round's
    ``StepRecord``, per group, identical on every rank. ``on_rank_loss="shrink"`` goes on
    without a replica group that lost a rank (module docstring); ``"stop"``, the default,
    does not. ``max_grad_norm``: clip the gradient of every optimizer step (a local step's
    too) to this total norm, as an FSDP loop clips between its backward and its step
    (``torch.nn.utils.clip_grad_norm_`` on the sharded gradients: the norm is the full
    model's, one all-reduce within the group; every group holds the same average, so the
    same norm).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        strategy: str | Strategy = "dropcompute",
        *,
        mesh: Any,
        replicate_dim: str = "replicate",
        timeout: datetime.timedelta | None = None,
        bucket_cap_mb: float = BUCKET_CAP_MB,
        micro_batches: int | None = None,
        on_rank_loss: str = "stop",
        max_grad_norm: float | None = None,
    ) -> None:
        rule = sharded_strategy(strategy, micro_batches)  # refused before any collective
        self.max_grad_norm = checked_max_grad_norm(max_grad_norm)
        demand = check_store(rule)
        shard_dim = check_mesh(mesh, replicate_dim)
        check_restart(on_rank_loss)
        self.model, self.optimizer = model, optimizer
        #: the job's ranks of each replica group, in group order (a probe names them)
        self.groups = replica_groups(mesh, replicate_dim)
        self.params = [p for p in model.parameters() if p.requires_grad]
        check_sharded(self.params, shard_dim)
        device = local(self.params[0]).device
        self.within = Collectives.of_group(mesh[shard_dim].get_group(), device, timeout)
        comm = ReplicaCollectives(self.within, mesh[replicate_dim].get_group(), device, timeout)
        lr = float(optimizer.param_groups[0]["lr"])
        shrinks = check_on_rank_loss(on_rank_loss, rule, None, comm, lr)
        self.rounds = Rounds(rule, comm, lr=lr, micro_batches=micro_batches, does=SHARDED.does)
        self.buckets = buckets([local(p) for p in self.params], bucket_cap_mb)
        #: dealt on demand: the group's side of the deal (``integrate.demand``; the group's
        #: first rank deals), the stream's place in ``rounds.stream``; None under other rules
        self.deal: StreamDeal | None = None
        if demand:
            dealer = open_dealer(self.within, comm, timeout)
            self.deal = StreamDeal(self.rounds, dealer, self.within, self, "ShardedStep")
        start_equal(model, self.params, self.within.group, comm.group)
        #: the elastic layer at group granularity (None: ``on_rank_loss="stop"``), where the
        #: call stands in it, and the round in flight's start, which a break puts back: the
        #: model's buffers and, under local steps, this rank's shards and the optimizer's state
        self.membership: GroupMembership | None = None
        self.call = StepCall.COMPLETED
        self._start: tuple[list[torch.Tensor] | None, Any, list[torch.Tensor]] | None = None
        if shrinks:
            self.membership = GroupMembership.start_groups(
                self.rounds, model, optimizer, timeout, self.groups, self.within
            )

    def __call__(
        self, micro_batches: Sequence[Any], loss_fn: Callable[[Any], torch.Tensor]
    ) -> StepRecord:
        """One round over this rank's ``micro_batches`` (dealt on demand: its stream, indexed
        by position); its ``StepRecord`` (per group). Under ``on_rank_loss="shrink"`` a round
        that a lost group broke is computed again among the groups that go on."""
        if self.membership is not None:
            return self._elastic(list(micro_batches), loss_fn)
        try:
            return self._round(micro_batches, loss_fn)
        except UsageError:  # refused before any deal or collective: nothing spent
            raise
        except BaseException:
            if self.deal is not None:  # the round's counters are spent: no call may reuse them
                self.deal.broken = True
                self.deal.fail()
            raise

    def _elastic(self, batches: list[Any], loss_fn: Callable[[Any], torch.Tensor]) -> StepRecord:
        """``StepCall``'s states for one call (module docstring): a round that breaks (a
        watched collective, FSDP's failing as a peer died, or the commit) is put back to its
        start and computed again once the groups that go on regrouped."""
        membership = self.membership
        assert membership is not None
        while True:
            self.call = StepCall.IN_FLIGHT
            try:
                record = self._round(batches, loss_fn)
            except (Broken, PeerFailure, RuntimeError) as exc:
                if not isinstance(exc, (Broken, PeerFailure)) and not lost_peer(exc):
                    raise  # the loop's own error, not a lost peer
                self.call = StepCall.BROKEN
                self._put_back()
                membership.broke(exc)
                self.call = StepCall.REDONE
                continue
            self.call, self._start = StepCall.COMPLETED, None
            return membership.completed(record)

    def _put_back(self) -> None:
        """The broken round's start: its buffers, and under local steps this rank's shards
        and the optimizer's state."""
        if self._start is None:
            return
        params, state, kept = self._start
        with torch.no_grad():
            for b, s in zip(self.model.buffers(), kept, strict=True):
                local(b).copy_(s)
            for p, s in zip(self.params, params or [], strict=params is not None):
                local(p).copy_(s)
        if state is not None:
            self.optimizer.load_state_dict(state)
        self._start = None

    def _round(
        self, micro_batches: Sequence[Any], loss_fn: Callable[[Any], torch.Tensor]
    ) -> StepRecord:
        rounds, dealt, demand = self.rounds, None, self.deal is not None
        batches = micro_batches if demand else list(micro_batches)
        plan, m = rounds.plan(0 if demand else len(batches))
        local_steps = plan.local_steps > 1
        # Local-SGD: the round's start, which the model average moves from (this rank's shards)
        start = [local(p).detach().clone() for p in self.params] if local_steps else None
        if self.membership is not None:  # a redo starts again from here
            kept = copy.deepcopy(self.optimizer.state_dict()) if local_steps else None
            buffers = [local(b).detach().clone() for b in self.model.buffers()]
            self._start = (start, kept, buffers)
        self.optimizer.zero_grad(set_to_none=True)
        work = RoundProgress(np.empty(0))
        if not demand:
            computed = self._compute(batches, loss_fn, plan, m, work)
        else:
            assert self.deal is not None
            computed, dealt = self.deal.compute(batches, loss_fn, plan, work)
        with torch.no_grad():
            if start is None:  # G_n: the group's mean gradient over its C_n micro-batches
                mine = [local_grad(p) for p in self.params]
                scale = 1.0 / max(work.done, 1)
            else:  # P_n: the group's local displacement per counted unit, times U
                mine = [local(p).detach() - s for p, s in zip(self.params, start, strict=True)]
                scale = len(work.times) / max(work.done, 1)
            bad = not all(bool(torch.isfinite(t).all()) for t in mine)
        # a probe watching this step times the round's collectives as this rank's wait (and,
        # watching the model too, FSDP's inside the micro-batches: ``probe.fsdp``)
        probe = watching(self)
        with probe.sync() if probe is not None else nullcontext():
            # the group's mean loss, and whether any of its shards is not finite: it screens
            # as one
            loss_sum, bads = self.within.reduce_row([work.loss_sum, bad])
            work.loss_sum = float(loss_sum) / self.within.world_size
            agreed = rounds.agree(work, plan, dealt)
            began = rounds.clock()
            with torch.no_grad():
                averaged, screened, total = weighted_average(
                    rounds.comm, self.buckets, mine, scale, agreed, bad=bool(bads > 0)
                )
            timing = rounds.timing(rounds.clock() - began, work, screened)
            if self.membership is not None:  # every member completed it, or none applies it
                self.membership.commit()
        if probe is not None:
            probe.note_samples(computed)
            probe.note_remedy(rounds.strategy.describe(), rounds.micro_batches or len(work.times))
        if start is not None:  # past the last collective: the model average
            with torch.no_grad():
                for p, s, avg in zip(self.params, start, averaged, strict=True):
                    local(p).copy_(s + plan.lr_scale * avg)
        elif total != 0:  # past the last collective; no gradient entered: no update
            with torch.no_grad():
                for p, avg in zip(self.params, averaged, strict=True):
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    local(p.grad).copy_(avg)
            if self.max_grad_norm is not None:  # the mean gradient's norm, before lr_scale
                torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            with torch.no_grad():
                for p in self.params:
                    local(p.grad).mul_(plan.lr_scale)
            self.optimizer.step()
        positions = None
        if self.deal is not None:  # past the round's collectives: its keys may go
            self.deal.leave()
            positions = self.deal.positions(agreed, int(sum(plan.shares)))
        return rounds.finish(plan, work, agreed, timing, positions)

    def _compute(
        self,
        batches: list[Any],
        loss_fn: Callable[[Any], torch.Tensor],
        plan: AllreducePlan,
        m: int,
        work: RoundProgress,
    ) -> int | None:
        """The round's micro-batches while the GROUP is admitted (steps 2 and, under
        Local-SGD, its local steps every ``m``: module docstring), measured into ``work``;
        the samples this rank computed (None: a batch without a size)."""
        rounds, local_steps, pending = self.rounds, plan.local_steps > 1, 0
        computed: int | None = 0
        # the group agrees before each micro-batch only where a finite tau can refuse one
        lockstep = math.isfinite(plan.threshold)
        probe = watching(self)  # the lockstep's wait for the group is the rank's wait too
        rounds.open(work, len(batches))
        for u, batch in enumerate(batches):
            admitted = rounds.admit(work, plan)
            if lockstep:
                asked = rounds.clock()
                refused = self._lockstep(admitted)
                if probe is not None:
                    probe.note_wait(rounds.clock() - asked)
                if refused and admitted:  # another rank of the group was refused: stop too
                    rounds.stop(work)
                admitted = not refused
            if not admitted:
                break
            began = rounds.clock()
            loss = loss_fn(batch)
            loss.backward()  # FSDP reduce-scatters within the group and accumulates the shard
            work.loss_sum += float(loss.detach())
            size = batch_samples(batch)
            computed = None if computed is None or size is None else computed + size
            rounds.unit_done(work, u, began)
            pending += 1
            if local_steps and (u + 1) % m == 0 and u + 1 < len(batches):  # a local step ends
                local_step(self.optimizer, self.params, m, self.max_grad_norm)
                pending = 0
        rounds.seal(work)
        if local_steps and pending:  # the group's counts agree: so do its local steps
            local_step(self.optimizer, self.params, m, self.max_grad_norm)
        return computed

    def _lockstep(self, admitted: bool) -> bool:
        """Whether any rank of the group was refused the next micro-batch: one all_reduce(MAX)
        over the group. Shrinking, it carries each rank's look at the generation's ``broken``
        key too, and the group's ranks leave after the same reduce, none inside FSDP's next
        collective (``integrate.group_membership``)."""
        membership = self.membership
        if membership is None:
            return self.within.reduce_row([not admitted], MAX)[0] > 0
        refused, broken = membership.lockstep.reduce_row(
            [not admitted, membership.sees_broken()], MAX
        )
        if broken > 0:
            raise Broken(f"generation {membership.shrinker.generation} broke (the group saw it)")
        return refused > 0

    def close(self) -> None:
        """Dealt on demand: after the last call, on every rank (a barrier), the last rounds'
        store keys go and the dealer's waiter ends. Nothing to do under any other rule."""
        if self.deal is not None:
            self.deal.close()

    @property
    def wants(self) -> int | None:
        """Micro-batches the next call computes on this rank: its group's share under
        ``rebalance`` (every rank of a group computes it); None under any other rule."""
        return self.rounds.wants()

    @property
    def shares(self) -> tuple[int, ...] | None:
        """Every group's micro-batches in the next call (``rebalance``), summing to R M; None
        under any other rule, and dealt on demand (a group takes what it asks for)."""
        plan = self.rounds.rule.plan()
        return None if plan.on_demand else plan.shares

    @property
    def micro_batches(self) -> int | None:
        """Sync's M, as given (``micro_batches=``)."""
        return self.rounds.micro_batches

    @property
    def rank(self) -> int:
        """This rank's replica group (the rule's worker): its index among the live groups
        (on the replicate dim until a shrink)."""
        return self.rounds.comm.rank

    @property
    def world_size(self) -> int:
        """The live replica groups (R until a shrink), the rule's N."""
        return self.rounds.comm.world_size

    @property
    def next_step(self) -> int:
        """The index of the next call's round (``record.step`` of its record)."""
        return self.rounds.step

    @property
    def live(self) -> tuple[int, ...]:
        """The replica groups that step now, in order (all of them until a shrink)."""
        return self.rounds.live

    @property
    def last(self) -> StepRecord | None:
        """The latest record under ``on_rank_loss="shrink"`` (None before the first, and
        under ``"stop"``)."""
        return None if self.membership is None else self.membership.last

    # ---- checkpoints: the rule's state and the round count, beside the sharded state dicts
    def state_dict(self) -> dict[str, Any]:
        """The rule's state and the round count (the same on every rank), dealt on demand the
        stream's place; save the model and the optimizer with ``torch.distributed.checkpoint``,
        beside it."""
        return self.rounds.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds.load_state_dict(state)


def check_restart(on_rank_loss: str, env: Any = os.environ) -> None:
    """One line for a rank that ``tailtrain launch --restart-lost`` started again: a sharded
    step does not take a group back yet (``integrate.group_membership``)."""
    if on_rank_loss == OnRankLoss.SHRINK and env.get(REJOIN) == "1":
        raise UsageError(
            'ShardedStep(on_rank_loss="shrink") goes on without a group that lost a rank but '
            "does not take a group started again back: launch without --restart-lost"
        )


__all__ = ["ReplicaCollectives", "ShardedStep"]
