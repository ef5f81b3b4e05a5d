"""The runtime's one registry of topologies: for each, what `train` needs to know of it.

A :class:`TopologySpec` says, for one ``Strategy.topology``, the simulator's engine that plays
it (by name: the runtime never imports ``tailtrain.sim``; ``sim.run.ENGINES`` maps the same
topology to that class, and a test holds the two together), the function every rank of a job
runs, the ranks it adds before the workers (a parameter server's rank 0), whether a worker
may die without ending a local job (``runtime.expendable``) and whether it keeps checkpoints.
Everything in the runtime and the CLI that depends on the topology reads it here; a rule
never names either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tailtrain.errors import UsageError
from tailtrain.runtime.allreduce.rounds import train_allreduce
from tailtrain.runtime.config import RankResult, TrainConfig
from tailtrain.runtime.partial.rounds import train_partial
from tailtrain.runtime.ps.server import train_parameter_server
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import Strategy, Topology, check_contract

RankEntry = Callable[[TrainConfig, Collectives], RankResult]


@dataclass(frozen=True)
class TopologySpec:
    """One runtime topology (module docstring)."""

    topology: Topology
    #: the class name of the simulator's engine for it (``sim.run.ENGINES``)
    engine: str
    #: the function every rank of a job of this topology runs
    entry: RankEntry
    #: ranks before the workers: rank ``extra_ranks + w`` is worker w
    extra_ranks: int = 0
    #: whether a local job goes on when a worker's rank dies (``runtime.expendable``)
    expendable_workers: bool = False
    #: whether its runs keep checkpoints, so ``--checkpoint-every`` and ``--resume`` apply
    checkpoints: bool = True
    #: what its rank entry does beyond the topology's protocol (``Strategy.needs``), as the
    #: simulator's engine names it (``does``): the allreduce's rounds deal per-rank shares,
    #: carry a threshold's cut to the next round and deal micro-batches on demand
    does: frozenset[str] = frozenset()

    def processes(self, workers: int) -> int:
        """Processes a job of ``workers`` workers needs."""
        return workers + self.extra_ranks

    def worker_of(self, rank: int) -> int | None:
        """The worker rank ``rank`` is (None: a rank of the topology's own, the server)."""
        return None if rank < self.extra_ranks else rank - self.extra_ranks


#: topology -> its spec; the one table (module docstring)
TOPOLOGY_SPECS: dict[Topology, TopologySpec] = {
    Topology.ALLREDUCE: TopologySpec(
        Topology.ALLREDUCE,
        "AllreduceEngine",
        train_allreduce,
        does=frozenset({"shares", "carry", "demand"}),
    ),
    Topology.PARTIAL_COLLECTIVE: TopologySpec(
        Topology.PARTIAL_COLLECTIVE, "PartialCollectiveEngine", train_partial
    ),
    Topology.PARAMETER_SERVER: TopologySpec(
        Topology.PARAMETER_SERVER,
        "ServerEngine",
        train_parameter_server,
        extra_ranks=1,
        expendable_workers=True,
    ),
}


def check_topology(strategy: Strategy) -> None:
    """A one-line error when ``train`` cannot run ``strategy``: no runtime topology for it,
    or one that cannot apply its weights (``Strategy.weights``, ``Strategy.defers``) or deal
    its plans (``Strategy.needs``)."""
    topology = strategy.topology
    if topology not in TOPOLOGY_SPECS:
        have = ", ".join(sorted(TOPOLOGY_SPECS))
        raise UsageError(
            f"strategy {strategy.describe()!r} needs the {topology} topology, which "
            f"`train` does not have yet; it has: {have}"
        )
    check_contract(strategy, topology, TOPOLOGY_SPECS[topology].does)


def spec_of(strategy: Strategy) -> TopologySpec:
    """The spec of the topology ``strategy`` runs on, once :func:`check_topology` passed."""
    check_topology(strategy)
    return TOPOLOGY_SPECS[strategy.topology]
