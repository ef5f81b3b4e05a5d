"""DropCompute for a job that keeps ``DistributedDataParallel``: a comm hook and its state.

    state = StragglerHookState("dropcompute:threshold=auto")
    ddp_model.register_comm_hook(state, weighted_allreduce_hook)
    for micro_batches in loader:
        for x, y in state.micro_batches(ddp_model, micro_batches):   # no_sync + threshold
            F.cross_entropy(ddp_model(x), y).backward()
        if not state.last.empty:      # no rank's gradient entered: no update
            optimizer.step()
        optimizer.zero_grad()

``micro_batches`` runs a round of ``tailtrain.integrate.rounds``: it yields micro-batches
inside ``ddp_model.no_sync()`` (gradients accumulate locally) while the threshold allows,
takes this rank's weight from its own counts and times, and then lets DDP reduce; the
agreement (every rank's counts and times, the rule's selection over them) rides in the first
bucket's allreduce, as ``train``'s round carries it, and is checked once the buckets came
(``StragglerHookState.reduce``). DDP reduces only in a backward that its forward armed,
and which micro-batch is a rank's last is known only after it ran; so the round ends with
DDP's own pre- and post-forward (the calls ``DistributedDataParallel.forward`` makes around
the module) around a zero loss that touches every parameter, and its backward fires the hook
on every bucket with the accumulated gradients. That backward computes nothing but zeros.

[`weighted_allreduce_hook`][tailtrain.weighted_allreduce_hook] reduces ``[w_n G_n, w_n,
withheld]`` per bucket (the first also every rank's agreement rows), G_n = (bucket) / C_n the
mean over the rank's counted micro-batches, and returns ``lr_scale * sum_n w_n G_n /
divisor`` (DropCompute Eq. (1) under its weights). It is asynchronous (``torch.futures``),
hence its own small allreduce rather than ``runtime.reduce.Collectives.weighted_sum``.
Local-SGD averages models, not gradients, so it has no hook: use
[`StragglerStep`][tailtrain.StragglerStep].

Under a [`StragglerProbe`][tailtrain.StragglerProbe] that watches the DDP model
(``probe.watch(ddp_model)``, which registers the model in ``integrate.probe``'s weak table:
``watching``), ``micro_batches`` runs
the round's collectives (the zero backward that fires the hook, whose first bucket is where a
fast rank waits for the slow one, and the closing gather; a half-precision model's agreement
is a gather of its own before them) inside ``probe.sync()``: the probe
counts them as this rank's wait and not its compute, ignores the zero backward's gradient
hooks (they are no step's gradients being ready), and takes the samples of the micro-batches
computed (cut ones never are) as the step's ``samples``.

**Losing a rank or a node** (``tailtrain launch --on-rank-loss shrink``, whose option the
state's ``on_rank_loss`` follows): once ``state.heal(ddp_model, optimizer)`` named what a
regroup hands over, ``micro_batches`` runs ``integrate.elastic_ddp``'s rounds instead: DDP's
reducer stays idle (its group is broken after a death), the state reduces over the live
ranks' generation, and a rank started again (its default group
``tailtrain.init_process_group``'s stand-in) joins in ``heal`` and passes the steps the live
ranks took before it.
"""

# no ``from __future__ import annotations``: DDP checks the hook's annotations as objects
import datetime
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tailtrain.errors import TailtrainError, UsageError
from tailtrain.integrate.average import carries_rows, divisor_of
from tailtrain.integrate.elastic_ddp import ElasticRounds
from tailtrain.integrate.probe import batch_samples, watching
from tailtrain.integrate.rounds import Agreement, RoundProgress, Rounds, StepRecord
from tailtrain.runtime.control import (
    RankWeighting,
    carried_rtol,
    check_agreement,
    check_own_weight,
)
from tailtrain.runtime.elastic.refusals import check_on_rank_loss
from tailtrain.runtime.elastic.shrink import OnRankLoss
from tailtrain.runtime.elastic.store import LAUNCHED, REJOIN
from tailtrain.runtime.reduce import Collectives, contribute, screens
from tailtrain.strategies.base import AllreducePlan, Strategy
from tailtrain.strategies.entries import HOOK, hook_refusal

#: tail of a bucket's allreduce: [w_n, weight withheld]
BUCKET_TAIL = 2


class _Bucket(NamedTuple):
    """One bucket as it came: its parameters, its reduced weights and those withheld, and
    what it was divided by."""

    params: list[torch.Tensor]
    summed: float
    withheld: float
    divided_by: float


@dataclass
class _Pending:
    """What the hook needs in the round's final backward: this rank's weight w_n, the divisor
    (None: the reduced sum of the weights), 1/C_n, lr_scale and this rank's agreement block
    (``rows``: (N, W), its own line filled); its answers: whether a bucket of this rank's was
    screened out (NaN or inf), every bucket as it came, and every rank's rows."""

    weight: float
    divisor: float | None
    scale: float
    lr_scale: float
    rows: torch.Tensor | None = None
    screened: bool = False
    buckets: list[_Bucket] = field(default_factory=list)
    reduced_rows: np.ndarray | None = None

    def settled(
        self,
        params: list[torch.Tensor],
        summed: float,
        withheld: float,
        divided_by: float,
        rows: torch.Tensor,
    ) -> None:
        """A bucket came (``weighted_bucket_allreduce``'s ``settled``); the first one holds
        every rank's rows."""
        self.buckets.append(_Bucket(params, summed, withheld, divided_by))
        if rows.numel():
            assert self.rows is not None  # only a block sent comes back
            # a copy: the rows share the reduced buffer DDP takes the bucket from
            self.reduced_rows = rows.double().cpu().numpy().reshape(self.rows.shape).copy()


class StragglerHookState:
    """The state of [`weighted_allreduce_hook`][tailtrain.weighted_allreduce_hook]: the rule, its
    state, the last round.

    ``process_group`` should be the DDP model's (None: the default group); ``timeout`` bounds
    the small gathers around the hook (the buckets' allreduces, where a fast rank waits for
    the slow one, are bounded by the group's own timeout, as DDP's are). Pickling and
    ``state_dict`` leave the process group out (as ``torch.distributed.algorithms``' hook
    states do); an unpickled state uses the default group.

    ``on_rank_loss``: ``"shrink"`` goes on without a rank or a node that dies or hangs and
    takes a restarted one back (``integrate.elastic_ddp``; under ``tailtrain launch
    --on-rank-loss shrink``, and after ``heal``); ``"stop"`` does not (a death ends the
    job, as DDP's does); None, the default, follows the launch: ``"shrink"`` under
    ``tailtrain launch --on-rank-loss shrink``, else ``"stop"``.

    ``on_nonfinite``: ``"skip"`` (the default) screens out a rank's bucket that holds a NaN or
    an infinity (it joins with weight 0, the others' mean is the update, the record counts it
    in ``nonfinite``); ``"propagate"`` lets it into the sum as DDP's own allreduce does, so
    every rank's gradient holds it. Give ``"propagate"`` with a ``torch.amp.GradScaler``: an
    overflow must reach the scaler, which then skips ``scaler.step(optimizer)`` on every rank
    and lowers its scale; screened out, the scaler never sees one, so its scale never comes
    down and every overflowing rank stays out of the update. ``"propagate"`` is refused with
    ``on_rank_loss="shrink"`` (use ``StragglerStep(..., scaler=)``, whose heal hands the
    scale over), and only fits an enabled scaler: ``GradScaler(enabled=False)`` lets a NaN
    into every rank's parameters, so give ``"skip"`` then.
    """

    def __init__(
        self,
        strategy: str | Strategy = "dropcompute",
        process_group: dist.ProcessGroup | None = None,
        timeout: datetime.timedelta | None = None,
        device: torch.device | None = None,
        on_rank_loss: str | None = None,
        on_nonfinite: str = "skip",
    ) -> None:
        if on_rank_loss is None:  # as the launch says
            launched = os.environ.get(LAUNCHED) == OnRankLoss.SHRINK
            on_rank_loss = OnRankLoss.SHRINK if launched else OnRankLoss.STOP
        if on_rank_loss not in tuple(OnRankLoss):
            raise UsageError(
                f"on_rank_loss must be one of {', '.join(OnRankLoss)}, got {on_rank_loss!r}"
            )
        self.on_rank_loss = OnRankLoss(on_rank_loss)
        #: False under ``on_nonfinite="propagate"``: a non-finite bucket enters the sum as is
        self.screens = screens(on_nonfinite)
        self.on_nonfinite = on_nonfinite
        if not self.screens and self.on_rank_loss is OnRankLoss.SHRINK:
            raise UsageError(
                'on_nonfinite="propagate" (a GradScaler) does not shrink under the DDP hook: a '
                "round the lead completed for this rank leaves it no gradient for scaler.step, "
                "and a rank taken back needs the live ranks' scale; use "
                'StragglerStep(..., scaler=scaler, on_rank_loss="shrink"), which hands it over'
            )
        self.process_group = process_group
        self.timeout = timeout
        device = device or torch.device("cpu")
        comm = Collectives.of_group(process_group, device, timeout)
        self.rounds = Rounds(strategy, comm, does=HOOK.does)
        refusal = HOOK.refusal(self.rounds.strategy)  # as declared: strategies.entries
        if refusal is not None:
            raise UsageError(refusal)
        self._last: StepRecord | None = None
        self._pending: _Pending | None = None
        #: buckets the hook reduced so far (every bucket once per round)
        self.buckets_reduced = 0
        #: the rounds under shrink, once ``heal`` named the model and the optimizer
        self.elastic: ElasticRounds | None = None

    @property
    def last(self) -> StepRecord | None:
        """The latest round's record (None before the first)."""
        return self.elastic.last if self.elastic is not None else self._last

    def heal(self, ddp_model: DistributedDataParallel, optimizer: torch.optim.Optimizer) -> None:
        """Under ``on_rank_loss="shrink"``, once, after the optimizer is built: the model and
        the optimizer whose state a regroup hands over (``integrate.elastic_ddp``). In a rank
        ``tailtrain launch --restart-lost`` started again it asks the live ranks to take it
        in, and returns with their model, optimizer and rule state (its loop then passes the
        steps they took: ``state.last.skipped``). Under ``"stop"`` it does nothing, so the
        same script runs under torchrun. One-line refusals where shrinking cannot work."""
        if self.on_rank_loss is OnRankLoss.STOP or self.elastic is not None:
            return
        rejoining = os.environ.get(REJOIN) == "1"
        lr = float(optimizer.param_groups[0]["lr"])
        comm = self.rounds.comm
        check_on_rank_loss(
            self.on_rank_loss, self.rounds.strategy, self.process_group, comm, lr,
            rejoining=rejoining,
        )  # fmt: skip
        self.elastic = ElasticRounds(
            self.rounds, ddp_model, optimizer, self.timeout, rejoining=rejoining
        )

    def micro_batches(
        self, ddp_model: DistributedDataParallel, micro_batches: Sequence[Any]
    ) -> Iterator[Any]:
        """Yield the round's micro-batches while the threshold allows; then reduce."""
        batches = list(micro_batches)
        if self.on_rank_loss is OnRankLoss.SHRINK:
            if self.elastic is None:
                raise UsageError(
                    "the DDP hook's state shrinks under `tailtrain launch --on-rank-loss "
                    "shrink`: call state.heal(ddp_model, optimizer) once after building the "
                    'optimizer (or give on_rank_loss="stop")'
                )
            yield from self.elastic.round(ddp_model, batches)
            return
        plan = self.plan(len(batches))
        work = RoundProgress(np.empty(0))
        computed: int | None = 0  # samples of the micro-batches computed (None: not known)
        for batch in self.rounds.units(batches, plan, work):
            with ddp_model.no_sync():
                yield batch
            size = batch_samples(batch)
            computed = None if computed is None or size is None else computed + size
        self.reduce(ddp_model, plan, work)
        probe = watching(ddp_model)
        if probe is not None:
            probe.note_samples(computed)

    def plan(self, units: int) -> AllreducePlan:
        """The round's plan for ``units`` micro-batches; a rule that averages models after
        local steps, which it did not declare (``averages_models``), is refused here."""
        plan, _ = self.rounds.plan(units)
        if plan.local_steps > 1:
            raise UsageError(hook_refusal(self.rounds.strategy, plan.local_steps))
        return plan

    def reduce(
        self,
        ddp_model: DistributedDataParallel,
        plan: AllreducePlan,
        work: RoundProgress,
        unit_scale: float = 1.0,
    ) -> StepRecord:
        """The round's end, once its counted micro-batches' backward ran under ``no_sync``:
        fire the hook on every bucket (``flush_buckets``), the first carrying the agreement's
        rows (a half-precision model's gathered before), check the selection over them against
        what the buckets were reduced with, and close the round; its record (also
        ``last``). ``unit_scale``: each micro-batch's gradient entered the accumulated one
        multiplied by it (Lightning divides each loss by ``accumulate_grad_batches``), so G_n
        divides it out again."""
        # a probe watching the model (``StragglerProbe.watch``) times the round's collectives
        # as this rank's wait, and skips the zero backward's gradient hooks (module docstring)
        probe = watching(ddp_model)
        with probe.sync() if probe is not None else nullcontext():
            scale = 1.0 / (unit_scale * max(work.done, 1))
            agreed: Agreement | None = None
            if carries_agreement(ddp_model):  # the rows ride in the first bucket
                own = self.rounds.own(work)
                rows = np.concatenate(self.rounds.own_rows(work))
                block = torch.zeros(self.rounds.comm.world_size, len(rows), dtype=torch.float64)
                block[self.rounds.comm.rank] = torch.from_numpy(rows)
                pending = _Pending(own.weight, own.divisor, scale, plan.lr_scale, block)
            else:  # half precision: gathered first, outside the reduce's seconds (T^c)
                agreed = self.rounds.agree(work)
                pending = _Pending(agreed.mine.weight, agreed.mine.divisor, scale, plan.lr_scale)
            self._pending = pending
            began = self.rounds.clock()
            try:  # a peer lost in DDP's buckets fails as in the rounds' own collectives
                with self.rounds.comm.guarded("the DDP buckets' all_reduce"):
                    flush_buckets(ddp_model)
            finally:
                self._pending = None
            reduce = self.rounds.clock() - began
            if agreed is None:
                agreed = self._agreement(work, pending)
            settle_buckets(agreed.mine, pending.buckets, self.rounds.comm.world_size)
            self._last = self.rounds.close(plan, work, agreed, reduce, pending.screened)
        if probe is not None:  # the loop's own or Lightning's: the run's row names the rule
            probe.note_remedy(self.rounds.strategy.describe(), len(work.times))
        return self._last

    def _agreement(self, work: RoundProgress, pending: _Pending) -> Agreement:
        """The rule's selection over the rows the first bucket carried; it must give this
        rank the weight its buckets were reduced with (``check_own_weight``, as ``train``'s
        round checks it). A check that fails raises before the loop's ``optimizer.step()``."""
        if pending.reduced_rows is None:
            raise TailtrainError(
                "no DDP bucket carried the round's agreement: register the hook with "
                "ddp_model.register_comm_hook(state, weighted_allreduce_hook)"
            )
        agreed = self.rounds.agreement(work, None, pending.reduced_rows)
        check_own_weight(pending.weight, agreed.mine.weight)
        return agreed

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The rule's state (``strategy.state_dict``) and the round count, no process group."""
        return self.rounds.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds.load_state_dict(state)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "strategy": self.rounds.strategy,
            "timeout": self.timeout,
            "device": self.rounds.comm.device,
            "rounds": self.rounds.state_dict(),
            "on_rank_loss": str(self.on_rank_loss),
            "on_nonfinite": self.on_nonfinite,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        on_rank_loss = state.get("on_rank_loss", OnRankLoss.STOP)
        self.__init__(
            state["strategy"], None, state["timeout"], state["device"], on_rank_loss,
            state.get("on_nonfinite", "skip"),
        )  # fmt: skip
        self.rounds.load_state_dict(state["rounds"])


def weighted_allreduce_hook(
    state: StragglerHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: ``lr_scale * sum_n w_n G_n / divisor`` of the bucket's gradients."""
    pending = state._pending
    state.buckets_reduced += 1
    if pending is None:
        raise UsageError(
            "weighted_allreduce_hook reduces at the end of a round: iterate "
            "state.micro_batches(ddp_model, micro_batches) and backward inside that loop"
        )
    rows = pending.rows if bucket.index() == 0 else None  # every rank fires bucket 0 first
    future, screened = weighted_bucket_allreduce(
        bucket.buffer(), pending.weight, None, pending.divisor, state.process_group,
        scale=pending.scale, lr_scale=pending.lr_scale, rows=rows,
        settled=partial(pending.settled, bucket.parameters()), screen=state.screens,
    )  # fmt: skip
    pending.screened = pending.screened or screened
    return future


def carries_agreement(ddp_model: DistributedDataParallel) -> bool:
    """Whether the model's buckets carry the agreement's rows: float32 or float64 gradients
    (``integrate.average.ROW_DTYPES``). DDP's own mixed precision registers a comm hook of its
    own, so it never meets this one."""
    return carries_rows([p for p in ddp_model.module.parameters() if p.requires_grad])


def settle_buckets(mine: RankWeighting, buckets: list[_Bucket], world_size: int) -> None:
    """Once the selection is known: every bucket's reduced weights plus those withheld must be
    its total (``check_agreement``), and each bucket divided by its divisor. A bucket divided
    by this rank's own divisor where the selection over every rank fixes another is rescaled
    (DropCompute ``divide-by=computed`` on a rank that counted nothing: 1 alone, the sum of
    the weights among all), so every rank's gradient is the same."""
    for bucket in buckets:
        eps = torch.finfo(bucket.params[0].dtype).eps  # the weights were summed in it
        rtol = carried_rtol(eps, world_size)
        check_agreement(mine.total, bucket.summed + bucket.withheld, rtol)
        by = divisor_of(mine.divisor, bucket.summed)
        if by != bucket.divided_by:
            with torch.no_grad():
                for p in bucket.params:
                    if p.grad is not None:
                        p.grad.mul_(bucket.divided_by / by)


def weighted_bucket_allreduce(
    buffer: torch.Tensor,
    weight: float,
    total: float | None,
    divisor: float | None,
    process_group: dist.ProcessGroup | None,
    *,
    scale: float = 1.0,
    lr_scale: float = 1.0,
    rows: torch.Tensor | None = None,
    settled: Callable[[float, float, float, torch.Tensor], None] | None = None,
    screen: bool = True,
) -> tuple[torch.futures.Future[torch.Tensor], bool]:
    """Start ``lr_scale * sum_n w_n (scale_n x_n) / divisor`` of a bucket ``x_n``: one
    asynchronous allreduce of ``[w_n scale_n x_n, w_n, withheld, rows]``. Returns its future
    and whether this rank's bucket was screened out.

    ``weight`` is this rank's w_n, ``total`` the sum over every rank that the rule expects
    (None: not known yet; the caller checks it with what ``settled`` is handed), ``divisor``
    the one it fixed (None: the reduced sum of the weights). ``rows``: this rank's (N, W)
    block of the agreement, its own line filled and zeros elsewhere, so the sum is every
    rank's rows (an all-gather riding in the allreduce, as ``Collectives.weighted_sum``'s).
    ``settled(reduced weights, withheld, divided by, reduced rows)`` is called as the bucket
    comes. A bucket holding a NaN or an infinity joins with weight 0 and zeros (0 * NaN is
    NaN) and reports the weight it withheld, so every rank's agreement check (reduced +
    withheld = expected) holds and the others' mean is divided by their own weights
    (``runtime.reduce.contribute``); with ``screen`` False it joins as it is, as in DDP's own
    allreduce (``on_nonfinite="propagate"``: a ``GradScaler`` then skips the step)."""
    mine = contribute(buffer, weight, bad=None if screen else False, scale=weight * scale)
    size, eps = buffer.numel(), torch.finfo(buffer.dtype).eps
    tail = torch.tensor([mine.weight, mine.withheld], dtype=buffer.dtype, device=buffer.device)
    parts = [mine.values, tail]
    if rows is not None:
        parts.append(rows.reshape(-1).to(buffer.dtype).to(buffer.device))
    work = dist.all_reduce(torch.cat(parts), group=process_group, async_op=True)

    def divide(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        reduced = future.value()[0]
        summed, withheld_sum = reduced[size : size + BUCKET_TAIL].double().cpu().tolist()
        if total is not None:  # summed in the bucket's dtype, by every rank of the group
            terms = dist.get_world_size(process_group)
            check_agreement(total, summed + withheld_sum, carried_rtol(eps, terms))
        by = divisor_of(divisor, summed)
        if settled is not None:
            settled(summed, withheld_sum, by, reduced[size + BUCKET_TAIL :])
        return reduced[:size].mul_(lr_scale / by)

    return work.get_future().then(divide), mine.screened


def flush_buckets(ddp_model: DistributedDataParallel) -> None:
    """A backward armed as DDP's forward arms it, of a zero loss touching every parameter: the
    hook fires on every bucket with the gradients accumulated under ``no_sync``.

    DDP's other collectives that would run in the next round's first forward (the one-time
    bucket rebuild, the buffer broadcast) run here instead, in the reduce phase, so that no
    rank's measured compute includes a wait for the others."""
    params = [p for p in ddp_model.module.parameters() if p.requires_grad]
    ddp_model._pre_forward()
    zero = torch.stack([(p.reshape(-1)[:1] * 0).sum() for p in params]).sum()
    ddp_model._post_forward(zero).backward()
    if ddp_model.reducer._rebuild_buckets():
        ddp_model._has_rebuilt_buckets = True
    if ddp_model._check_sync_bufs_pre_fwd():
        ddp_model._sync_buffers()
    ddp_model.require_forward_param_sync = False
