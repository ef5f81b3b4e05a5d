"""Collectives of the runtime: the weighted allreduce and the small all-gathers around it.

* :meth:`Collectives.weighted_sum` is the hivemind-style weighted allreduce: one
  ``all_reduce(SUM)`` of the flat buffer ``[w_n g_n (D values), w_n, extras..., rows...]``
  gives ``sum_n w_n g_n`` and ``sum_n w_n`` (and sums of per-rank scalars such as losses) on
  every rank, and every rank's small rows (counts, times) laid out block-diagonally. It
  serves every weighting: sync (w = 1/N), DropCompute (w = C_n/(M N) or C_n/sum C),
  Local-SGD's model average. A rank that computed nothing joins with w_n = 0, so nobody waits
  for a collective that never comes. :meth:`Collectives.start` is the same collective over a
  :class:`SumBuffer` kept from round to round, launched: the caller works while it runs and
  then waits for it (:class:`PendingSum`).
* :meth:`Collectives.gather` all-gathers one small float64 row per rank (counts, times), so
  that every rank feeds the rule identical arrivals, where no allreduce can carry them.

Every collective runs on ``group`` (None: the default process group) and, given ``timeout``,
waits at most that long for its result (``Work.wait``); otherwise the group's own timeout holds.

The collectives carry the rank's fault drills (:attr:`Collectives.drill`, ``--inject-fault``):
the boundary every rank entry gets, armed once per run by the launcher, so every topology's
rank meets the same drills (``runtime.rank.drive_rank``).

A collective that fails because a peer died raises :class:`PeerFailure` on the survivors only
after ``grace`` seconds: the launcher, which stops the job at the first failed rank, then
names the rank that failed first instead of one that merely lost its partner.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from tailtrain.errors import TailtrainError, UsageError

if TYPE_CHECKING:
    from tailtrain.runtime.inject import FaultDrill

log = logging.getLogger(__name__)

#: seconds a rank whose collective failed waits before it fails too (see the module docstring)
GRACE = 2.0
#: how long a receive that nothing bounds waits (the partial collective's receiver, the
#: parameter server's wire): without limit, in effect; gloo wants a finite timeout and
#: closes the pair when one passes
UNBOUNDED_WAIT = datetime.timedelta(days=365)
#: the GIL's switch interval in a rank whose threads must answer promptly (the partial
#: collective's reducer, the parameter server's receiver): ``sys.setswitchinterval``
SWITCH_INTERVAL = 5e-4

#: one rank's small row of numbers (counts, times): an array, a list or a tuple
RankRow = np.ndarray | Sequence[float]

SUM = dist.AllreduceOptions()
SUM.reduceOp = dist.ReduceOp.SUM


class PeerFailure(RuntimeError):
    """A collective failed, most likely because another rank died or timed out."""


class WeightedSum(NamedTuple):
    """``numerator`` = sum_n w_n g_n, ``total`` = sum_n w_n, ``extras`` summed over ranks."""

    numerator: torch.Tensor
    total: float
    extras: np.ndarray
    rows: tuple[np.ndarray, ...] = ()


class Contribution(NamedTuple):
    """This rank's part of a weighted allreduce after the screen (:func:`contribute`)."""

    #: the values to sum (scaled), or zeros when screened out
    values: torch.Tensor
    #: w_n, or 0 when screened out
    weight: float
    #: the weight screened out (w_n, else 0): every rank checks reduced + withheld = expected
    withheld: float
    screened: bool


#: what a DDP comm hook's state does with a bucket holding a NaN or an infinity
#: (``on_nonfinite``): ``skip`` screens it out (:func:`contribute`); ``propagate`` lets it into
#: the sum as DDP's own allreduce does, so every rank's reduced gradient holds it and a
#: ``torch.amp.GradScaler`` skips the step on every rank and lowers its scale
HOOK_ON_NONFINITE = ("skip", "propagate")


def screens(on_nonfinite: str) -> bool:
    """Whether a hook given ``on_nonfinite`` (:data:`HOOK_ON_NONFINITE`) screens a non-finite
    bucket out; anything else is refused in one line."""
    if on_nonfinite not in HOOK_ON_NONFINITE:
        raise UsageError(
            f"on_nonfinite must be one of {', '.join(HOOK_ON_NONFINITE)}, got {on_nonfinite!r}"
            " (propagate: with a torch.amp.GradScaler)"
        )
    return on_nonfinite == "skip"


def contribute(
    values: torch.Tensor, weight: float, *, bad: bool | None = None, scale: float = 1.0
) -> Contribution:
    """What this rank puts into a weighted allreduce: ``scale * values`` with weight w_n, or,
    if ``values`` hold a NaN or an infinity (``bad``, when the caller has screened already),
    zeros with weight 0, reporting the w_n it withheld. The others' sum is then divided by their
    own weights, and every rank's agreement check (``runtime.control.check_agreement``: the
    reduced weights plus those withheld are the rule's total) still holds. The one screen of
    ``train``'s allreduce rounds and of the loop entries' bucket reductions (``integrate``).

    Zeros, not ``0 * values``: 0 * NaN is NaN. ``values`` come back as they are (the same
    tensor) when ``scale`` is 1."""
    if bad is None:
        bad = not bool(torch.isfinite(values).all())
    if bad:
        return Contribution(torch.zeros_like(values), 0.0, weight, True)
    return Contribution(values if scale == 1.0 else values * scale, weight, 0.0, False)


class Collectives:
    """The process group's collectives on ``device`` (CPU for gloo, this rank's GPU for nccl);
    ``rank`` and ``world_size`` are those within ``group``."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        device: torch.device,
        grace: float = GRACE,
        group: dist.ProcessGroup | None = None,
        timeout: datetime.timedelta | None = None,
    ):
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.grace = grace
        self.group = group
        self.timeout = timeout
        self._drill: FaultDrill | None = None
        #: waits for this group's collectives instead of ``Work.wait`` when set: the
        #: allreduce's shrink bounds each by a learned deadline (``runtime.elastic.shrink``)
        self.watch: Callable[[dist.Work], None] | None = None

    @property
    def drill(self) -> FaultDrill:
        """This rank's fault drills (:meth:`arm`; none until armed)."""
        if self._drill is None:
            from tailtrain.faults import FaultPlan
            from tailtrain.runtime.inject import FaultDrill  # the drills only where a run is

            self._drill = FaultDrill(FaultPlan(), self.rank)
        return self._drill

    def arm(self, drill: FaultDrill) -> None:
        """Carry ``drill`` (``runtime.inject.FaultDrill``) for the run about to start."""
        self._drill = drill

    @classmethod
    def of_group(
        cls,
        group: dist.ProcessGroup | None,
        device: torch.device,
        timeout: datetime.timedelta | None = None,
    ) -> Collectives:
        """This process's view of ``group`` (None: the default group), already initialised."""
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        return cls(rank, size, device, group=group, timeout=timeout)

    def _wait(self, work: dist.Work | None) -> None:
        if work is None:
            return
        if self.watch is not None:
            self.watch(work)
        elif self.timeout is None:
            work.wait()
        else:
            work.wait(self.timeout)

    def gather(self, row: RankRow) -> np.ndarray:
        """All ranks' rows, (N, len(row)) float64, identical on every rank.

        A gather to the group's first rank and a broadcast back: two hops instead of a ring
        all-gather's N - 1, for rows so small that only latency counts (8 gloo ranks on a
        loaded 2-core machine: 3.5 ms against 14 ms per call)."""
        mine = torch.as_tensor(np.asarray(row, dtype=np.float64), device=self.device)
        parts = [torch.empty_like(mine) for _ in range(self.world_size)] if self.rank == 0 else None
        with self._guard("all_gather"):
            self._wait(dist.gather(mine, parts, group=self.group, group_dst=0, async_op=True))
            rows = (
                torch.stack(parts)
                if parts is not None
                else mine.new_empty(self.world_size, len(mine))
            )
            self._wait(dist.broadcast(rows, group=self.group, group_src=0, async_op=True))
        return rows.cpu().numpy()

    def reduce_row(
        self, row: RankRow, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
    ) -> np.ndarray:
        """A small float64 row reduced elementwise over the group (``op``: SUM or MAX),
        identical on every rank: one all_reduce of ``len(row)`` values."""
        values = torch.as_tensor(np.asarray(row, dtype=np.float64), device=self.device)
        with self._guard("all_reduce"):
            self._wait(dist.all_reduce(values, op=op, group=self.group, async_op=True))
        return values.cpu().numpy()

    def weighted_sum(
        self,
        grad: torch.Tensor,
        weight: float,
        extras: Sequence[float] = (),
        rows: Sequence[RankRow] = (),
    ) -> WeightedSum:
        """sum_n w_n g_n and sum_n w_n in one all_reduce, plus the sums of ``extras``.

        Each of ``rows`` rides along as an (N, len(row)) block holding this rank's row in line
        ``rank`` and zeros elsewhere, so the sum is every rank's row: an all-gather without a
        collective of its own (x + 0 is exact, and a NaN stays in its own line). The rows come
        back in ``grad``'s dtype (float32: times to about 1e-7 relative, counts exact).
        """
        buffer = SumBuffer(self, grad.numel(), len(extras), [len(row) for row in rows], grad.dtype)
        reduced = self.start(buffer, weight, extras, rows, grad).wait()
        return reduced._replace(numerator=reduced.numerator.to(grad.device))

    def start(
        self,
        buffer: SumBuffer,
        weight: float,
        extras: Sequence[float] = (),
        rows: Sequence[RankRow] = (),
        grad: torch.Tensor | None = None,
    ) -> PendingSum:
        """Launch :meth:`weighted_sum` over ``buffer``, whose ``grad`` already holds this
        rank's gradient unless ``grad`` is given; :meth:`PendingSum.wait` finishes it. Between
        the two the caller may do work that needs nothing from this collective."""
        buffer.fill(weight, extras, rows, grad)
        # the group's own allreduce: dist.all_reduce's checks cost ~30 us a round with the
        # caches cold from compute, and the buffer is ours, contiguous on the right device
        group = dist.group.WORLD if self.group is None else self.group
        with self._guard("all_reduce"):
            work = group.allreduce([buffer.tensor], SUM)
        return PendingSum(self, buffer, work)

    def barrier(self) -> None:
        """A one-element allreduce: works on every backend without device ids."""
        with self._guard("barrier"):
            self._wait(
                dist.all_reduce(torch.zeros(1, device=self.device), group=self.group, async_op=True)
            )

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        out = [None] * self.world_size if self.rank == 0 else None
        with self._guard("gather_object"):
            dist.gather_object(obj, out, group=self.group, group_dst=0)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (the others' ``obj`` is not sent)."""
        box = [obj if self.rank == 0 else None]
        with self._guard("broadcast_object"):
            dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]

    def guarded(self, name: str) -> _Guard:
        """A context in which a failed collective this class did not start (DDP's bucket
        allreduces under a comm hook) raises :class:`PeerFailure` after ``grace`` seconds, as
        its own collectives' failures do (module docstring)."""
        return self._guard(name)

    def _guard(self, name: str) -> _Guard:
        return _Guard(name, self.rank, self.grace)


class SumBuffer:
    """The flat buffer [w_n g_n (D), w_n, extras (E), rows (N x widths)] of
    :meth:`Collectives.weighted_sum`, reusable: a runtime that reduces the same layout every
    round allocates it once and computes its gradient straight into :attr:`grad` (a view),
    instead of a new buffer and two copies of the gradient per round. What :meth:`read`
    returns of the gradient is a view too, valid until the buffer is filled again."""

    def __init__(
        self, comm: Collectives, dim: int, extras: int, widths: Sequence[int], dtype: torch.dtype
    ) -> None:
        self.rank, self.n, self.dim = comm.rank, comm.world_size, dim
        self.extras, self.widths = extras, list(widths)
        tail = 1 + extras + self.n * sum(self.widths)
        self.tensor = torch.zeros(dim + tail, dtype=dtype, device=comm.device)
        self.grad = self.tensor[:dim]
        self.tail = self.tensor[dim:]
        # on the CPU the tail is written and read through a numpy view, without a staging copy
        # (numpy has no bfloat16: such a tail is staged as a GPU's is)
        viewable = comm.device.type == "cpu" and dtype is not torch.bfloat16
        self.host = self.tail.numpy() if viewable else None
        # where this rank's values go in the tail: w_n, the extras, its line of each block
        mine, start = [np.arange(1 + extras)], 1 + extras
        for width in self.widths:
            mine.append(np.arange(width) + start + self.rank * width)
            start += self.n * width
        self.mine = np.concatenate(mine)

    def fill(
        self,
        weight: float,
        extras: Sequence[float],
        rows: Sequence[RankRow],
        grad: torch.Tensor | None = None,
    ) -> None:
        """w_n times the gradient (``grad``, or what :attr:`grad` holds), w_n, the extras and
        this rank's line of each row block; zeros in the other ranks' lines."""
        if grad is not None:
            torch.mul(grad.to(self.tensor.device), weight, out=self.grad)
        elif weight != 1.0:
            self.grad.mul_(weight)
        values = [weight, *extras]
        for row, width in zip(rows, self.widths, strict=True):
            if len(row) != width:
                raise ValueError(f"a row of {len(row)} values for a block {width} wide")
            values.extend(row)
        tail = np.zeros(self.tail.numel()) if self.host is None else self.host
        tail.fill(0.0)
        tail[self.mine] = values  # one write: a few numpy calls fewer, each ~5 us run cold
        if self.host is None:
            self.tail.copy_(torch.from_numpy(tail))

    def read(self) -> WeightedSum:
        """The reduced sums, the extras and every rank's rows (float64 copies)."""
        host = self.tail.double().cpu().numpy() if self.host is None else self.host
        summed = host.astype(np.float64)
        start, gathered = 1 + self.extras, []
        for width in self.widths:
            gathered.append(summed[start : start + self.n * width].reshape(self.n, width))
            start += self.n * width
        sums = summed[1 : 1 + self.extras]
        return WeightedSum(self.grad, float(summed[0]), sums, tuple(gathered))


class PendingSum:
    """A launched :meth:`Collectives.start`; :meth:`wait` (bounded by the group's timeout,
    or the collectives' own) gives its :class:`WeightedSum`."""

    __slots__ = ("buffer", "comm", "work")

    def __init__(self, comm: Collectives, buffer: SumBuffer, work: dist.Work | None) -> None:
        self.comm, self.buffer, self.work = comm, buffer, work

    def wait(self) -> WeightedSum:
        with self.comm._guard("all_reduce"):
            self.comm._wait(self.work)
        return self.buffer.read()


#: errors a guarded section may raise that no peer causes: passed as they are (``_Guard``)
OWN_ERRORS = (UsageError, torch.OutOfMemoryError, NotImplementedError)


class _Guard:
    """Turns a collective's failure into :class:`PeerFailure` after ``grace`` seconds (module
    docstring). A class, not a ``@contextmanager``: its generator costs ~10 us a call, on
    every round's allreduce.

    A failure is what a collective raises: a ``RuntimeError`` (gloo, nccl and torch's
    ``DistError`` are ones) or tailtrain's own (a watch's ``Broken``). Anything else, e.g. a
    ``ValueError`` of the user's gradient hook in the DDP hook's zero backward
    (:meth:`Collectives.guarded`), a ``UsageError``, and the ``RuntimeError`` s no peer
    causes (out of memory, not implemented), is the caller's and passes as it is. A user's
    own plain ``RuntimeError`` there still reads as a peer's failure, its text kept."""

    __slots__ = ("grace", "name", "rank")

    def __init__(self, name: str, rank: int, grace: float) -> None:
        self.name, self.rank, self.grace = name, rank, grace

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        if not isinstance(exc, RuntimeError | TailtrainError) or isinstance(exc, OWN_ERRORS):
            return
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        log.info("rank %d: %s failed (%s); waiting %gs", self.rank, self.name, first, self.grace)
        time.sleep(self.grace)
        raise PeerFailure(f"{self.name} failed, a peer may have died: {first}") from exc
