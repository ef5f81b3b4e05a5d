"""``advise --for``'s answer to "can this job run this spec" is the entries' own
(``strategies.entries``): the same as the tables it replaced for every row advise prices,
the same refusal ``integrate`` raises, and a new allreduce strategy reaches ``--for loop``
with no edit in ``advice/``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from tailtrain.advice.adopt import SETUPS, check_setup, runnable
from tailtrain.errors import UsageError
from tailtrain.integrate.rounds import as_strategy
from tailtrain.integrate.step import DEALS
from tailtrain.strategies import registry
from tailtrain.strategies.base import Plan, Strategy, Topology
from tailtrain.strategies.registry import parse_strategy

#: spec -> (a DDP job runs it, an own loop runs it); the specs advise's rows carry
#: (``prediction.families.row_spec``, ``advice.recommend.REBALANCE``, ``DEMAND_SPEC``)
EXPECTED = {
    "sync": (True, True),
    "dropcompute:threshold=0.05": (True, True),
    "local-sgd:period=4": (False, True),  # a hook reduces gradients; it cannot average models
    "local-sgd:period=1": (False, True),  # models averaged after each step: still no hook
    "rebalance": (True, True),  # a DDP job: rebalance_loader's fixed shares
    "rebalance:then=dropcompute": (False, True),  # no threshold on the DDP job's shares
    "rebalance:deal=demand": (False, True),  # StragglerStep deals a stream's positions
    "k-sync:k=2": (False, False),
    "k-batch-sync:k=2": (False, False),
    "async": (False, False),
    "dbw": (False, False),
    "lgc:k=2": (False, False),
    "eager:mode=solo": (False, False),
    "dbw-quorum": (False, False),
}


@pytest.mark.parametrize("spec", EXPECTED)
def test_each_job_runs_what_its_entries_declare(spec):
    family = spec.partition(":")[0]
    ddp, loop = EXPECTED[spec]
    assert runnable(family, "ddp", spec) is ddp
    assert runnable(family, "loop", spec) is loop
    assert runnable(family, "tailtrain-train", spec) and runnable(family, "any", spec)


@pytest.mark.parametrize("spec", EXPECTED)
def test_the_loop_answer_is_what_stragglerstep_checks(spec):
    """One contract: ``--for loop`` offers exactly what ``StragglerStep`` accepts."""
    rule = parse_strategy(spec)
    try:
        as_strategy(rule, DEALS)
    except UsageError:
        accepted = False
    else:
        accepted = True
    assert runnable(spec.partition(":")[0], "loop", spec) is accepted


def test_a_loader_compensation_is_refused_where_the_loop_refuses_it():
    spec = "dropcompute:threshold=0.05,compensate=resample"
    with pytest.raises(UsageError, match="your data loader decides"):
        as_strategy(spec, DEALS)
    assert not runnable("dropcompute", "loop", spec)
    assert not runnable("dropcompute", "ddp", spec)


@dataclass(frozen=True)
class NewRule(Strategy):
    """A strategy advise has never heard of: an allreduce rule with no extras."""

    name: str = "new-rule"
    topology: ClassVar[Topology] = Topology.ALLREDUCE

    def init(self, ctx):
        return None

    def plan(self, state):
        return Plan(k=1)


def test_a_new_allreduce_strategy_reaches_for_loop_with_no_edit_in_advice(monkeypatch):
    monkeypatch.setitem(registry.BUILDERS, "new-rule", lambda spec: NewRule())
    assert runnable("new-rule", "loop", "new-rule")
    assert runnable("new-rule", "ddp", "new-rule")  # the DDP comm hook runs it too


def test_an_unknown_job_is_refused_in_one_line():
    assert check_setup("loop") == "loop" and set(SETUPS) == {
        "ddp",
        "loop",
        "lightning",
        "hf",
        "fsdp",
        "tailtrain-train",
        "any",
    }
    with pytest.raises(UsageError, match="--for 'cluster': use one of ddp, loop"):
        check_setup("cluster")


@pytest.mark.parametrize("spec", EXPECTED)
def test_the_lightning_answer_is_what_stragglerstrategy_accepts(spec):
    """``--for lightning`` offers what ``StragglerStrategy`` builds (the hook's rule, or
    rebalance by fixed shares); ``--for hf`` ranks as a DDP job (rebalance in
    ``RebalancedTrainer``, DropCompute's lines moved to a loop the user owns)."""
    from tailtrain.lightning.strategy import checked_rule

    accepted = False
    for shares in (None, [2, 2]):
        try:
            checked_rule(spec, shares)
        except UsageError:
            continue
        accepted = True
    family = spec.partition(":")[0]
    assert runnable(family, "lightning", spec) is accepted
    assert runnable(family, "hf", spec) is runnable(family, "ddp", spec)


@pytest.mark.parametrize("spec", EXPECTED)
def test_the_fsdp_answer_is_what_shardedstep_accepts(spec):
    """``--for fsdp`` offers what ``ShardedStep`` builds (``strategies.entries.SHARDED``)."""
    from tailtrain.integrate.sharded import sharded_strategy

    try:
        sharded_strategy(spec, 4)
    except UsageError:
        accepted = False
    else:
        accepted = True
    assert runnable(spec.partition(":")[0], "fsdp", spec) is accepted
