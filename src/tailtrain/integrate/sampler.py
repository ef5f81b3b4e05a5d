"""A sampler that deals each step's global batch to the ranks by ``rebalance``'s shares.

Sync's global batch is N M micro-batches of B samples; ``rebalance`` (``strategies.rebalance``)
has rank n compute m_n of them, sum_n m_n = N M, m_n following its measured speed. For a
user's loop the global batch must then be drawn once for all ranks and dealt, not drawn from
per-rank shards: [`ShareSampler`][tailtrain.ShareSampler] permutes the dataset once an epoch (the
same seeded permutation on every rank, as ``torch.utils.data.DistributedSampler``), cuts it into
global batches of N M B samples and deals step s's micro-batches in order (``tasks.stream.deal``,
the simulator's and ``train``'s dealing): rank n gets the m_n after the first sum_{k<n} m_k. So
every sample of an epoch is computed exactly once, by whichever rank its share reaches, and no
rank's data is under-represented however slow that rank is.

The shares are read from the step as each step's indices are yielded, after the previous call
moved them: iterate it lazily and index the dataset yourself, one micro-batch per list of
indices (``[collate(dataset, i) for i in indices]``). Not ``DataLoader(batch_sampler=...)``:
it would collate the whole share into one batch, and a prefetching loader would read the
shares a step early.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np
from torch.utils.data import Sampler

from tailtrain.errors import UsageError
from tailtrain.tasks.stream import deal


class DealsShares(Protocol):
    """What the sampler reads of a step (``StragglerStep``)."""

    @property
    def shares(self) -> Sequence[int] | None: ...

    @property
    def micro_batches(self) -> int | None: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...


class ShareSampler(Sampler[list[list[int]]]):
    """Yields, step by step, this rank's micro-batches (lists of dataset indices) of the
    epoch's global batches, dealt by ``step.shares`` (module docstring).

    ``size``: the dataset's length; ``micro_batch_size``: B. An epoch has
    ``size // (N M B)`` steps; the last ``size mod (N M B)`` samples of its permutation wait
    for the next epoch's (``drop_last``). Call [`set_epoch`][tailtrain.ShareSampler.set_epoch]
    before each epoch. Under a rule without shares every rank gets M micro-batches of its own:
    sync's global batch.
    """

    def __init__(
        self, size: int, step: DealsShares, *, micro_batch_size: int, seed: int = 0
    ) -> None:
        m = step.micro_batches
        if m is None:
            raise UsageError(
                "ShareSampler deals N M micro-batches a step: make the step with "
                "micro_batches=M (StragglerStep(..., micro_batches=M))"
            )
        if micro_batch_size < 1:
            raise UsageError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.global_batch = step.world_size * m * micro_batch_size
        if size < self.global_batch:
            raise UsageError(
                f"a dataset of {size} samples holds no global batch of {self.global_batch} "
                f"(N={step.world_size} ranks x M={m} x B={micro_batch_size}); lower M or B"
            )
        self.size, self.step, self.seed, self.epoch = size, step, seed, 0
        self.batch, self.m = micro_batch_size, m

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose permutation the next iteration deals (every rank the same)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size // self.global_batch

    def __iter__(self) -> Iterator[list[list[int]]]:
        n, rank = self.step.world_size, self.step.rank
        order = np.random.default_rng((self.seed, self.epoch)).permutation(self.size)
        steps = order[: len(self) * self.global_batch].reshape(len(self), n, self.m, self.batch)
        for batches in steps:
            shares = self.step.shares  # read now: the previous call may have moved them
            if shares is None:
                mine = batches[rank]
            else:
                dealt = deal(batches, np.asarray(shares, dtype=np.int64))
                mine = dealt[rank, : shares[rank]]
            yield mine.tolist()
