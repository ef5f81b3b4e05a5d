"""Which runtime topology runs a strategy (the rule declares it, ``Strategy.topology``, for
every entry point), and the one registry that says what `train` needs of each
(``runtime.launching.topologies.TopologySpec``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tailtrain
from tailtrain.errors import UsageError
from tailtrain.runtime.launching.topologies import TOPOLOGY_SPECS, spec_of
from tailtrain.runtime.ps.server import train_parameter_server
from tailtrain.strategies.base import Topology
from tailtrain.strategies.registry import parse_strategy


@pytest.mark.parametrize(
    ("text", "topology"),
    [
        ("sync", Topology.ALLREDUCE),
        ("sync:mode=psi", Topology.PARAMETER_SERVER),  # a named mode is a server's schedule
        ("sync:mode=pull", Topology.PARAMETER_SERVER),
        ("sync:mode=psw", Topology.PARAMETER_SERVER),
        ("dropcompute", Topology.ALLREDUCE),
        ("k-sync:k=2", Topology.PARAMETER_SERVER),
        ("eager:mode=solo", Topology.PARTIAL_COLLECTIVE),
    ],
)
def test_a_sync_with_a_mode_runs_on_the_parameter_server(text, topology):
    strategy = parse_strategy(text)
    assert strategy.topology is topology  # the rule declares it: every entry runs it there
    assert parse_strategy(strategy.describe()) == strategy  # and its text says which
    assert spec_of(strategy).processes(2) == 2 + (topology is Topology.PARAMETER_SERVER)


def test_train_runs_a_sync_with_a_mode_on_the_parameter_server():
    assert spec_of(parse_strategy("sync:mode=pull")).entry is train_parameter_server


def test_every_topology_has_one_spec_naming_the_simulators_engine_for_it():
    """The runtime names the simulator's engine without importing it; the names hold."""
    from tailtrain.sim.run import ENGINES

    assert set(TOPOLOGY_SPECS) == set(Topology) == set(ENGINES)
    for topology, spec in TOPOLOGY_SPECS.items():
        assert spec.topology is topology
        assert ENGINES[topology].__name__ == spec.engine
        # train deals what simulate deals (Strategy.needs): the same rules run in both
        assert spec.does == getattr(ENGINES[topology], "does", frozenset())


def test_a_parameter_servers_rank_0_is_no_worker():
    server = TOPOLOGY_SPECS[Topology.PARAMETER_SERVER]
    assert [server.worker_of(r) for r in range(3)] == [None, 0, 1]
    assert server.expendable_workers and server.processes(8) == 9
    allreduce = TOPOLOGY_SPECS[Topology.ALLREDUCE]
    assert [allreduce.worker_of(r) for r in range(2)] == [0, 1]
    assert not allreduce.expendable_workers and allreduce.processes(8) == 8


def test_train_own_model_takes_its_topology_from_the_rule():
    """Plain sync is an allreduce strategy everywhere, so the parameter-server runner refuses
    it before anything starts (and names the synchronous parameter-server strategy)."""
    with pytest.raises(UsageError, match="allreduce topology") as err:
        tailtrain.train_own_model(
            lambda: nn.Linear(2, 2),
            nn.functional.cross_entropy,
            lambda: (torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64)),
            strategy="sync",
            workers=2,
            iterations=1,
        )
    assert "k-sync:k=2" in str(err.value) and "\n" not in str(err.value)


def test_train_own_model_never_resumes_an_old_runs_checkpoint(tmp_path):
    """The parameter server goes on from a checkpoint it finds in its folder (a restart);
    a new own-model run is refused a folder that holds one, before anything starts, since
    the run's identity cannot tell the user's model from another."""
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(UsageError, match="already holds a run") as err:
        tailtrain.train_own_model(
            lambda: nn.Linear(2, 2),
            nn.functional.cross_entropy,
            lambda: (torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64)),
            strategy="k-sync:k=2",
            workers=2,
            iterations=1,
            out=tmp_path,
        )
    assert "\n" not in str(err.value)
