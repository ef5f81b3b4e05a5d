"""Which runtime topology runs a strategy, and how many processes it needs.

Each topology is a rank entry ``(config, collectives) -> RankResult``. The simulator maps the
same ``Strategy.topology`` to its engines (``sim.run.ENGINES``); a rule never names either.
"""

from __future__ import annotations

from collections.abc import Callable

from tailtrain.errors import UsageError
from tailtrain.runtime.allreduce.rounds import train_allreduce
from tailtrain.runtime.config import RankResult, TrainConfig
from tailtrain.runtime.partial.rounds import train_partial
from tailtrain.runtime.ps.server import train_parameter_server
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import Strategy, Topology, check_contract, topology_of

RankEntry = Callable[[TrainConfig, Collectives], RankResult]

#: topology -> the function every rank of a job of that topology runs
TOPOLOGIES: dict[Topology, RankEntry] = {
    Topology.ALLREDUCE: train_allreduce,
    Topology.PARTIAL_COLLECTIVE: train_partial,
    Topology.PARAMETER_SERVER: train_parameter_server,
}


def check_topology(strategy: Strategy) -> None:
    """A one-line error when ``train`` cannot run ``strategy``: no runtime topology for it,
    or one that cannot apply its weights (``Strategy.weights``, ``Strategy.defers``)."""
    topology = topology_of(strategy)
    if topology not in TOPOLOGIES:
        have = ", ".join(sorted(TOPOLOGIES))
        raise UsageError(
            f"strategy {strategy.describe()!r} needs the {topology_of(strategy)} topology, which "
            f"`train` does not have yet; it has: {have}"
        )
    check_contract(strategy, topology)


def rank_entry_of(strategy: Strategy) -> RankEntry:
    check_topology(strategy)
    return TOPOLOGIES[topology_of(strategy)]


#: topologies whose ranks other than 0 may die without ending the job (``runtime.expendable``)
EXPENDABLE_WORKERS = {Topology.PARAMETER_SERVER}


def expendable_workers(strategy: Strategy) -> bool:
    """Whether a local job of ``strategy`` goes on when a rank other than 0 dies."""
    return topology_of(strategy) in EXPENDABLE_WORKERS


def processes(strategy: Strategy, workers: int) -> int:
    """Processes a job of ``workers`` workers needs (a parameter server adds one)."""
    return workers + (topology_of(strategy) is Topology.PARAMETER_SERVER)
