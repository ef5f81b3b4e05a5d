"""Adopt a tailtrain strategy in your own PyTorch training loop.

* [`StragglerStep`][tailtrain.StragglerStep]: a training-loop step that owns the micro-batch loop,
  the threshold, the weighted allreduce and the rule (``sync``, ``dropcompute``, ``local-sgd``,
  ``rebalance``).
* [`ShareSampler`][tailtrain.ShareSampler]: deals each step's global batch to the ranks by
  ``rebalance``'s shares, for a [`StragglerStep`][tailtrain.StragglerStep] (every sample of an epoch
  once).
* [`ShardedStep`][tailtrain.ShardedStep]: the same step for a model ``fully_shard``ed (FSDP2)
  within each group of a (replicate x shard) mesh: the replica group is the rule's worker
  (``sync``, ``dropcompute``, ``rebalance``; ``integrate.sharded``).
* [`StragglerHookState`][tailtrain.StragglerHookState] and
  [`weighted_allreduce_hook`][tailtrain.weighted_allreduce_hook]: DropCompute for a job that keeps
  ``DistributedDataParallel`` (a comm hook, ``no_sync`` accumulation).
* ``rebalance_loader``, ``ShareBatchSampler`` and ``sample_weighted_hook``: per-rank batch
  shares for a ``DistributedDataParallel`` job with a ``DistributedSampler``, each rank weighted
  by its samples so the update is the global batch's mean (``integrate.share_loader``).

* [`StragglerProbe`][tailtrain.StragglerProbe]: measures any loop (a DDP job by gradient hooks) and
  names the slow ranks, writing the trace ``tailtrain advise`` reads.

The first two drive the simulator's own rule objects (``tailtrain.runtime.control``) and return a
``StepRecord`` per round: who took part, with which weight, under which threshold.

``StragglerStep(..., on_rank_loss="shrink")``, started by ``tailtrain launch --nproc-per-node N
--on-rank-loss shrink script.py``, goes on without a rank that dies or hangs (``integrate.step``);
a rank the survivors went on without raises ``Refused``. The DDP hook's state shrinks and
heals under the same launch after ``state.heal(ddp_model, optimizer)`` (``integrate.elastic_ddp``;
a restarted rank's default group: ``tailtrain.init_process_group``, ``integrate.default_group``);
both stand on one ``integrate.membership``. ``ShardedStep(..., on_rank_loss="shrink")`` goes
on without a replica group that lost a rank (``integrate.group_membership``).
"""

from tailtrain.integrate.ddp import StragglerHookState, weighted_allreduce_hook
from tailtrain.integrate.probe import ProbeReport, StragglerProbe
from tailtrain.integrate.rounds import StepRecord
from tailtrain.integrate.sampler import ShareSampler
from tailtrain.integrate.sharded import ShardedStep
from tailtrain.integrate.share_loader import (
    ShareBatchSampler,
    rebalance_loader,
    sample_weighted_hook,
)
from tailtrain.integrate.step import StragglerStep
from tailtrain.runtime.elastic.shrink import Refused

__all__ = [
    "ProbeReport",
    "Refused",
    "ShardedStep",
    "ShareBatchSampler",
    "ShareSampler",
    "StepRecord",
    "StragglerHookState",
    "StragglerProbe",
    "StragglerStep",
    "rebalance_loader",
    "sample_weighted_hook",
    "weighted_allreduce_hook",
]
