"""The one driver loop: every topology applies a rule's deferred (``later``) weights."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tailtrain.core.scenario import Scenario
from tailtrain.sim.run import simulate
from tailtrain.strategies.base import Selection, Strategy
from tailtrain.strategies.registry import parse_strategy


class ConstantTask:
    """Every gradient is 1 (D = 1) whatever the model and the data."""

    has_model = True
    batch_size = 1
    metric_name = "none"
    n_classes = None
    dim = 1
    n_train = 64

    def __init__(self) -> None:
        self.theta = None

    def init_params(self, seed):
        return torch.zeros(1, dtype=torch.float32)

    def train_labels(self):
        return None

    def grads(self, theta, indices):
        n = len(indices)
        return torch.zeros(n, dtype=torch.float32), torch.ones(n, 1, dtype=torch.float32)

    def grads_multi(self, thetas, indices):
        return self.grads(thetas[0], indices)

    def evaluate(self, theta):
        self.theta = theta.clone()
        return {"train_loss": 0.0}


@dataclasses.dataclass(frozen=True)
class Wrapped(Strategy):
    """Wraps a rule and hands every call to it; the wrappers below change one call each."""

    inner: Strategy = None
    name: str = "wrapped"

    @property
    def topology(self):  # type: ignore[override]
        return self.inner.topology

    def init(self, ctx):
        return self.inner.init(ctx)

    def plan(self, state):
        return self.inner.plan(state)

    def select(self, state, arrivals):
        return self.inner.select(state, arrivals)

    def adapt(self, state, stats):
        return self.inner.adapt(state, stats)


@dataclasses.dataclass(frozen=True)
class Deferred(Wrapped):
    """Moves all the rule's weight to ``later``: each step applies the previous step's
    gradients (LGC's one-step delay, for every topology)."""

    name: str = "deferred"

    def select(self, state, arrivals):
        now = self.inner.select(state, arrivals).now
        zero = dataclasses.replace(now, weight=np.zeros_like(now.weight), total=1.0)
        return Selection(now=zero, later=now)


def final_theta(strategy: Strategy, steps: int) -> float:
    task = ConstantTask()
    scenario = Scenario(task="logreg", workers=3, delay="const:value=1", iterations=steps, lr=0.5)
    simulate(scenario, strategy, 0, task=task)
    return float(task.theta[0])


@pytest.mark.parametrize("spec", ["sync", "dropcompute:threshold=inf", "eager:mode=quorum,k=3"])
def test_every_topology_applies_deferred_weights_one_step_later(spec):
    """Gradients are all 1: applied at once, T steps move theta by -lr T; deferred by one step,
    by -lr (T - 1), the last step's term still pending."""
    plain = final_theta(parse_strategy(spec), steps=5)
    deferred = final_theta(Deferred(inner=parse_strategy(spec)), steps=5)
    assert plain == pytest.approx(-0.5 * 5)
    assert deferred == pytest.approx(-0.5 * 4)


FORBIDDEN = ("tailtrain.sim", "tailtrain.delays", "tailtrain.tasks", "torch")


def test_strategies_import_no_engine_delay_model_task_or_torch():
    root = Path(__file__).parents[2] / "src" / "tailtrain" / "strategies"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad = [n for n in names if n.split(".")[0] == "torch" or n.startswith(FORBIDDEN)]
            assert not bad, f"{path.name} imports {bad}"
    # and loading every rule pulls in no engine and no torch
    code = (
        "import sys, tailtrain.strategies.registry; "
        "print([m for m in sys.modules if m == 'torch' or m.startswith(('tailtrain.sim', "
        "'tailtrain.tasks'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@dataclasses.dataclass(frozen=True)
class Watching(Wrapped):
    """Keeps the gradient moments each step's statistics carried."""

    seen: list = dataclasses.field(default_factory=list)
    name: str = "watching"

    def adapt(self, state, stats):
        self.seen.append((stats.grad_sq_sum, stats.mean_grad_sq))
        return self.inner.adapt(state, stats)


@pytest.mark.parametrize("spec", ["sync", "k-sync:k=2", "eager:mode=quorum,k=3"])
def test_only_a_rule_that_adapts_gets_the_gradient_moments(spec):
    """A rule that never adapts reads no statistics, so the engine skips the moments' passes
    over the gradients; one that adapts gets them (all gradients 1: each has norm 1)."""
    from tailtrain.core.scenario import World
    from tailtrain.sim.driver import drive
    from tailtrain.sim.run import ENGINES

    scenario = Scenario(task="logreg", workers=3, delay="const:value=1", iterations=3, lr=0.5)
    for strategy in (parse_strategy(spec), Watching(inner=parse_strategy(spec))):
        world = World.build(scenario, 0, task=ConstantTask())
        engine = ENGINES[strategy.topology](world)
        drive(engine, strategy, world)
        assert engine.weighted_update.moments is not strategy.keeps_state
    assert strategy.seen and all(m == 1.0 and s >= 1.0 for s, m in strategy.seen)
