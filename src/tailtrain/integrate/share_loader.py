"""Rebalance a ``DistributedDataParallel`` job: per-rank batch shares and a sample-weighted hook.

A persistent straggler (an older GPU, a throttled node) makes every synchronous step wait for
it. ``rebalance`` keeps the global batch of N B samples and deals it by shares instead: rank n
computes b_n samples a step, sum_n b_n = N B, b_n following its speed. Two lines in a loop
that keeps its ``DistributedSampler``, its ``sampler.set_epoch(epoch)`` and one batch a step:

    from tailtrain import rebalance_loader, sample_weighted_hook
    loader = rebalance_loader(loader, shares=[48, 16])  # after loader = DataLoader(...)
    ddp.register_comm_hook(loader.batch_sampler, sample_weighted_hook)  # after ddp = DDP(...)

**The deal.** ``ShareBatchSampler`` reads the ``DistributedSampler``'s permutation of the
epoch (its seed, shuffle and epoch, at each ``__iter__``). That sampler gives rank k the
positions k, k + N, k + 2N, ... of it, so step s of sync draws the N B positions after the
first s N B, rank k's B of them being its own; written rank-major, that global batch is dealt
in order by ``tasks.stream.deal`` (the simulator's dealing, a sample for a micro-batch): rank
n gets the b_n samples after the first sum_{k<n} b_k. Equal shares therefore give every rank
exactly the batches its ``DistributedSampler`` gave it, every sample of an epoch is computed at
most once, by whichever rank its share reaches, and the last ``len(dataset) mod N B`` samples
of the permutation are left out (``drop_last``): every rank has ``len(dataset) // (N B)`` steps.

**The update.** With a loss that is the mean over the rank's b_n samples, DDP's bucket on rank n
holds g_n, the mean gradient over them, and ``sample_weighted_hook`` returns
sum_n (b_n / sum_k b_k) g_n: the mean gradient over the global batch, i.e. single-process
SGD on the N B samples concatenated (DropCompute Eq. (1), N. Giladi et al., NeurIPS 2023, with
the micro-batch counts replaced by the shares, as ``strategies.rebalance`` weighs them). DDP's
default hook would average the g_n with weights 1/N and over-weigh the slow rank's few samples.
A bucket holding a NaN or an infinity joins with weight 0, screened as
``tailtrain.integrate.weighted_allreduce_hook`` screens it (one shared path,
``integrate.ddp.weighted_bucket_allreduce``): the update is then the others' sample-weighted
mean, and ``ShareBatchSampler.screened`` counts this rank's buckets left out; under
``on_nonfinite="propagate"`` (a ``torch.amp.GradScaler``) it enters the sum as it is, as in
DDP's own allreduce, so every rank's scaler skips the step.

The shares come from ``tailtrain.strategies.rebalance.optimal_shares`` (per-sample times, total
N B, floor 1), which ``tailtrain advise --for ddp`` calls and prints.
"""

# no ``from __future__ import annotations``: DDP checks the hook's annotations as objects
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, Sampler

from tailtrain.errors import UsageError
from tailtrain.integrate.ddp import weighted_bucket_allreduce
from tailtrain.runtime.reduce import screens
from tailtrain.tasks.stream import deal

#: the ``DataLoader`` options ``rebalance_loader`` carries to the new loader as they were
#: (the others, ``batch_size``, ``shuffle``, ``sampler``, ``drop_last``, become its batch sampler)
CARRIED = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def checked_shares(shares: Any, ranks: int, batch_size: int) -> list[int]:
    """``shares`` as ints, or a one-line ``UsageError``: one int >= 1 per rank, summing
    to the global batch N B."""
    try:
        values = [operator.index(s) for s in shares]
    except TypeError:
        values = []
    if len(values) != ranks or min(values) < 1 or sum(values) != ranks * batch_size:
        shown = [int(v) for v in values] if values else shares
        raise UsageError(
            f"shares={shown}: give one int >= 1 per rank ({ranks} ranks) summing to the global "
            f"batch N*B = {ranks}*{batch_size} = {ranks * batch_size} "
            "(tailtrain.strategies.rebalance.optimal_shares computes them)"
        )
    return values


class ShareBatchSampler(Sampler[list[int]]):
    """This rank's share of each global batch of the ``DistributedSampler``'s epoch (module
    docstring), and the state of ``sample_weighted_hook``.

    ``sampler``: the loader's ``DistributedSampler`` (its ``num_replicas``, ``rank``,
    ``dataset``, ``seed``, ``shuffle``, and its ``epoch`` read at each ``__iter__``, so
    ``sampler.set_epoch(epoch)`` keeps working); ``shares``: samples per step for each rank,
    each >= 1, summing to N x ``batch_size``; ``process_group``: the DDP model's, which the hook
    reduces on (None: the default group). ``state_dict`` and pickling leave the process
    group out, as ``torch.distributed.algorithms``' hook states do (an unpickled state reduces
    on the default group). ``on_nonfinite``: as ``StragglerHookState``'s (``"propagate"`` with
    a ``torch.amp.GradScaler``, so that an overflow reaches it).
    """

    def __init__(
        self,
        sampler: DistributedSampler,
        shares: Sequence[int],
        batch_size: int,
        *,
        process_group: dist.ProcessGroup | None = None,
        on_nonfinite: str = "skip",
    ) -> None:
        self.shares = checked_shares(shares, sampler.num_replicas, batch_size)
        #: False under ``on_nonfinite="propagate"``: a non-finite bucket enters the sum as is
        self.screens = screens(on_nonfinite)
        self.on_nonfinite = on_nonfinite
        if len(sampler.dataset) < sampler.num_replicas * batch_size:  # type: ignore[arg-type]
            raise UsageError(
                f"a dataset of {len(sampler.dataset)} samples holds no global batch of "  # type: ignore[arg-type]
                f"N*B = {sampler.num_replicas}*{batch_size}; lower the batch size"
            )
        self.sampler, self.batch_size, self.process_group = sampler, batch_size, process_group
        #: this rank's buckets the hook screened out (a NaN or an infinity): joined with weight 0
        self.screened = 0

    @property
    def rank(self) -> int:
        return self.sampler.rank

    @property
    def world_size(self) -> int:
        return self.sampler.num_replicas

    def __len__(self) -> int:
        """Steps per epoch, the same on every rank: ``len(dataset) // (N B)``."""
        return len(self.sampler.dataset) // (self.world_size * self.batch_size)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        n, b, steps = self.world_size, self.batch_size, len(self)
        # the user's sampler's epoch permutation: theirs with one replica (no padding)
        whole = DistributedSampler(
            self.sampler.dataset, num_replicas=1, rank=0,
            shuffle=self.sampler.shuffle, seed=self.sampler.seed,
        )  # fmt: skip
        whole.set_epoch(self.sampler.epoch)
        order = np.fromiter(whole, dtype=np.int64, count=len(whole))[: steps * n * b]
        # position j N + k of step s is rank k's j-th sample under the DistributedSampler
        sync = order.reshape(steps, b, n).transpose(0, 2, 1).reshape(steps, n * b)
        return iter(sync[:, self.positions()].tolist())

    def positions(self) -> np.ndarray:
        """Where this rank's share lies in sync's rank-major global batch (``deal``)."""
        n, b, shares = self.world_size, self.batch_size, np.asarray(self.shares)
        dealt = deal(np.arange(n * b).reshape(n, b, 1), shares)
        return dealt[self.rank, : shares[self.rank], 0]

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The shares, the batch size and the screened count; no process group."""
        return {
            "shares": list(self.shares),
            "batch_size": self.batch_size,
            "screened": self.screened,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["batch_size"] != self.batch_size:
            raise UsageError(
                f"the state was saved at batch size {state['batch_size']}, this loader's is "
                f"{self.batch_size}: the global batch N*B must stay the same"
            )
        self.shares = checked_shares(state["shares"], self.world_size, self.batch_size)
        self.screened = int(state["screened"])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "process_group": None}


def sample_weighted_hook(
    state: ShareBatchSampler, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: ``sum_n (b_n / sum_k b_k) g_n`` of the bucket's gradients, b_n = the
    shares of ``state`` (a ``ShareBatchSampler``).

    With each rank's loss the mean over its own batch, that is the global batch's mean
    gradient (module docstring); a loss summed over the batch would be weighted twice. One
    asynchronous allreduce of the scaled ``bucket.buffer()`` on ``state.process_group``; a
    non-finite bucket joins with weight 0 (counted in ``state.screened``), or as it is where
    the state propagates (``on_nonfinite``)."""
    weight = float(state.shares[state.rank])
    future, screened = weighted_bucket_allreduce(
        bucket.buffer(), weight, float(sum(state.shares)), None, state.process_group,
        screen=state.screens,
    )  # fmt: skip
    state.screened += int(screened)
    return future


def rebalance_loader(
    loader: DataLoader,
    shares: Sequence[int],
    *,
    process_group: dist.ProcessGroup | None = None,
    on_nonfinite: str = "skip",
) -> DataLoader:
    """A ``DataLoader`` over ``loader``'s dataset whose batch sampler deals this rank its
    ``shares[rank]`` samples of each global batch of N B (``ShareBatchSampler``).

    ``loader`` is ``DataLoader(dataset, batch_size=B, sampler=DistributedSampler(dataset),
    ...)``; its ``num_workers``, ``collate_fn``, ``pin_memory``, ``persistent_workers``,
    ``prefetch_factor``, ``worker_init_fn``, ``generator`` (and the rest of ``CARRIED``) carry
    over; its ``drop_last`` does not matter, the epoch's remainder is always left out.
    ``shares``: one int >= 1 per rank, summing to N B (``optimal_shares``). ``process_group``:
    the DDP model's (None: the default group); where ``torch.distributed`` is initialised its
    size and this rank must be the sampler's. ``on_nonfinite``: the hook's
    (``ShareBatchSampler``). Register the hook with
    ``ddp.register_comm_hook(loader.batch_sampler, sample_weighted_hook)``.

    Refused in one line: an ``IterableDataset`` (no index to deal) and a loader without a
    ``DistributedSampler``: without one every rank reads the whole dataset, so there is no
    global batch to deal and an epoch would change meaning.
    """
    if isinstance(loader.dataset, IterableDataset):
        raise UsageError(
            "rebalance_loader deals dataset indices; an IterableDataset has none: give a "
            "map-style dataset with a DistributedSampler"
        )
    batches = loader.batch_sampler
    # a loader rebalanced before takes new shares on the same DistributedSampler
    plain = isinstance(batches, BatchSampler) and isinstance(batches.sampler, DistributedSampler)
    if not (plain or isinstance(batches, ShareBatchSampler)):
        raise UsageError(
            "rebalance_loader deals a DistributedSampler's epoch: build the loader as "
            "DataLoader(dataset, batch_size=B, sampler=DistributedSampler(dataset), ...)"
        )
    sampler, batch_size = batches.sampler, batches.batch_size
    if dist.is_available() and dist.is_initialized():
        group = (dist.get_world_size(process_group), dist.get_rank(process_group))
        if group != (sampler.num_replicas, sampler.rank):
            raise UsageError(
                f"the DistributedSampler is rank {sampler.rank} of {sampler.num_replicas}, but "
                f"rank {group[1]} of {group[0]} in the process group: give the DDP model's group"
            )
    dealt = ShareBatchSampler(
        sampler, shares, batch_size, process_group=process_group, on_nonfinite=on_nonfinite
    )
    carried = {name: getattr(loader, name) for name in CARRIED if hasattr(loader, name)}
    return SharedLoader(loader.dataset, batch_sampler=dealt, **carried)


class SharedLoader(DataLoader):
    """The loader [`rebalance_loader`][tailtrain.rebalance_loader] returns: a ``DataLoader`` whose
    ``sampler`` is still the user's ``DistributedSampler``, so a loop that calls
    ``loader.sampler.set_epoch(epoch)`` (PyTorch's DDP tutorial does) keeps working; the batch
    sampler deals, and reads the epoch from it."""

    @property  # type: ignore[override]
    def sampler(self) -> Sampler[int]:
        return self.batch_sampler.sampler

    @sampler.setter
    def sampler(self, _: Sampler[int]) -> None:
        # DataLoader.__init__ sets a SequentialSampler it never uses under a batch sampler
        pass
