"""The allreduce topology on real gloo ranks: SGD equivalence, decisions as simulated, tau*,
and a static rule's rounds accounted with their rows.

One local job of three ranks runs every configuration in turn (a launch costs seconds here),
and the tests read its per-rank results; the last tests run one rank in the test's process.
The references are written from the definitions:
synchronous SGD on the concatenated mini-batches, and Local-SGD's average of local models.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tailtrain.cli import main
from tailtrain.core.scenario import Scenario
from tailtrain.delays import parse_delay
from tailtrain.errors import TailtrainError
from tailtrain.runtime import config
from tailtrain.runtime.allreduce import rounds as allreduce
from tailtrain.runtime.allreduce.rounds import train_allreduce
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.control import RuleDriver
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.launch import launch
from tailtrain.runtime.reduce import Collectives
from tailtrain.sim.run import simulate
from tailtrain.strategies.base import ArrivalColumns, Selection, Weighting
from tailtrain.strategies.kfamily import Sync
from tailtrain.strategies.registry import parse_strategy
from tailtrain.tasks import parse_partition, parse_task
from tailtrain.tasks.stream import job_batches

N = 3
SEED = 5
#: injected unit seconds: 0.15 each, plus 0, 0.15 or 0.3 on an iteration's first unit,
#: rotating over the ranks: delays 150 ms apart, and with tau = 0.375 every partial sum lies
#: MARGIN from tau, so a process stalled for less than 75 ms on a loaded machine decides as
#: simulated (at 50 ms, CI's two test workers stalled two rounds of 20 now and then)
UNIT, SKEWS = 0.15, (0.0, 0.15, 0.3)
DELAY = f"const:value={UNIT}"
PATTERN = f"rotating:low={SKEWS[0]},high={SKEWS[-1]}"
TAU = 0.375
MARGIN = 0.075
PARITY_ROUNDS = 20
#: a threshold no injected unit (UNIT seconds at least) ends before
EMPTY_TAU = 0.01


def scenario(**kw) -> Scenario:
    base = {"task": "logreg", "workers": N, "iterations": 3, "eval_every": 100}
    return Scenario(**{**base, **kw})


CASES = {
    "sync": (scenario(), "sync", False),
    "dropcompute-inf": (scenario(micro_batches=2), "dropcompute:threshold=inf", False),
    "local-sgd-1": (scenario(micro_batches=2), "local-sgd:period=1", False),
    "local-sgd-2": (scenario(iterations=2), "local-sgd:period=2", False),
    "between": (
        scenario(delay=DELAY, pattern=PATTERN, micro_batches=2, iterations=PARITY_ROUNDS),
        f"dropcompute:threshold={TAU},stop=between",
        True,
    ),
    "preempt": (
        scenario(delay=DELAY, pattern=PATTERN, micro_batches=2, iterations=PARITY_ROUNDS),
        f"dropcompute:threshold={TAU}",
        True,
    ),
    "local-sgd-between": (
        scenario(delay=DELAY, pattern=PATTERN, iterations=PARITY_ROUNDS),
        f"local-sgd:period=2,threshold={TAU},stop=between",
        True,
    ),
    "auto": (
        scenario(
            delay="const:value=0.02",
            pattern="rotating:low=0,high=0.06",
            micro_batches=2,
            iterations=5,
        ),
        "dropcompute:calibrate=3",
        True,
    ),
    # tau far below every unit's injected UNIT s: no rank counts a micro-batch in any round
    "empty": (scenario(delay=DELAY, micro_batches=2), f"dropcompute:threshold={EMPTY_TAU}", True),
}
NAMES = list(CASES)


@pytest.fixture(scope="module")
def results():
    configs = [
        TrainConfig(scenario=s, strategy=text, seed=SEED, inject=inject, timeout=60)
        for s, text, inject in CASES.values()
    ]
    by_rank = launch(configs, reserve(Endpoint("127.0.0.1", 0)))
    assert sorted(by_rank) == list(range(N))
    return {name: [by_rank[r][i] for r in range(N)] for i, name in enumerate(NAMES)}


# ---- independent references --------------------------------------------------------------------
def batch_gradient(task, theta: torch.Tensor, indices: np.ndarray) -> torch.Tensor:
    """Gradient of the mean cross-entropy over ``indices`` by plain autograd on an nn.Module."""
    assert task.l2 == 0
    model = task.module_at(theta)
    x, y = task.data.x_train[indices], task.data.y_train[indices]
    loss = F.cross_entropy(model(x), y)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))])


def world_data(s: Scenario):
    task = parse_task(s.task, seed=SEED)
    partition = parse_partition(s.partition).assign(task, N, np.random.default_rng(SEED))
    return task, partition


def sgd_on_concatenated_batches(s: Scenario) -> torch.Tensor:
    task, partition = world_data(s)
    theta, units = task.init_params(SEED), s.micro_batches or 1
    for r in range(s.iterations):
        batches = job_batches(partition, SEED, task.batch_size, np.arange(N), np.full(N, r), units)
        theta = theta - 0.1 * batch_gradient(task, theta, batches.reshape(-1))
    return theta


def local_sgd(s: Scenario, period: int) -> torch.Tensor:
    """Each worker takes ``period`` SGD steps on its own batches; then the models are averaged."""
    task, partition = world_data(s)
    theta = task.init_params(SEED)
    for r in range(s.iterations):
        batches = job_batches(partition, SEED, task.batch_size, np.arange(N), np.full(N, r), period)
        local = []
        for n in range(N):
            mine = theta
            for h in range(period):
                mine = mine - 0.1 * batch_gradient(task, mine, batches[n, h])
            local.append(mine)
        theta = torch.stack(local).mean(0)
    return theta


# ---- (a) no delay: every strategy is synchronous SGD --------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["sync", "dropcompute-inf", "local-sgd-1"])
def test_without_delays_every_strategy_is_sgd_on_the_concatenated_batches(results, name):
    s = CASES[name][0]
    expected = sgd_on_concatenated_batches(s).numpy()
    for result in results[name]:
        np.testing.assert_allclose(result.theta, expected, rtol=1e-5, atol=1e-6)
        assert [row["completed"] for row in result.record.steps] == [[s.micro_batches or 1] * N] * 3


@pytest.mark.timeout(120)
def test_local_sgd_averages_the_local_models(results):
    expected = local_sgd(CASES["local-sgd-2"][0], period=2).numpy()
    for result in results["local-sgd-2"]:
        np.testing.assert_allclose(result.theta, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NAMES)
def test_every_rank_ends_with_the_same_parameters_and_records(results, name):
    first = results[name][0]
    for other in results[name][1:]:
        assert np.array_equal(other.theta, first.theta)
        for a, b in zip(first.record.steps, other.record.steps, strict=True):
            assert (a["completed"], a["threshold"]) == (b["completed"], b["threshold"])


# ---- (b) decisions as the simulator makes them -----------------------------------------------
def test_the_injected_partial_sums_lie_far_from_tau():
    """A unit counts iff its partial sum ends before tau (preempt) or starts by tau (between):
    the partial sums of two units, the first skewed, are the only times compared with tau."""
    sums = [skew + UNIT * u for skew in SKEWS for u in (1, 2)]
    assert min(abs(t - TAU) for t in sums) >= MARGIN - 1e-12


def decisions(steps) -> list[tuple]:
    """Each round's decisions: every rank's completed micro-batches, and tau."""
    return [(tuple(row["completed"]), row["threshold"]) for row in steps]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["between", "preempt", "local-sgd-between"])
def test_injected_delays_give_the_simulators_decisions(results, name):
    """Issue 10: >= 95% of the rounds make the simulator's decisions (all of them, stalled by
    the machine or not)."""
    s, text, _ = CASES[name]
    simulated = decisions(simulate(s, parse_strategy(text), SEED).steps)
    trained = decisions(results[name][0].record.steps)
    assert len(trained) == len(simulated) == PARITY_ROUNDS
    same = [a == b for a, b in zip(trained, simulated, strict=True)]
    assert np.mean(same) >= 0.95, [(a, b) for a, b in zip(trained, simulated, strict=True)]
    assert len({c for c, _ in simulated}) > 1  # the rotating skew changes who drops


@pytest.mark.timeout(120)
def test_a_rank_that_computed_nothing_joins_with_weight_zero(results):
    """Preempting at tau, the rank with the largest skew completes no unit in some rounds."""
    steps = results["preempt"][0].record.steps
    idle = [row for row in steps if 0 in row["completed"]]
    assert idle
    for row in idle:
        assert row["workers"] == [n for n, c in enumerate(row["completed"]) if c > 0]


@pytest.mark.timeout(120)
def test_a_round_that_ran_nothing_leaves_the_parameters_and_says_so(results):
    """tau below every unit: Algorithm 1 stops every rank before its first micro-batch, so
    every weight is 0 and no update is made; the rows say so as the simulator's do (the rule
    and the row are shared), with no measured loss, and the summary counts them."""
    s, text, _ = CASES["empty"]
    initial = parse_task(s.task, seed=SEED).init_params(SEED).numpy()
    simulated = simulate(s, parse_strategy(text), SEED).steps
    assert all(row.get("empty") for row in simulated)
    for result in results["empty"]:
        np.testing.assert_array_equal(result.theta, initial)
        steps = result.record.steps
        assert len(steps) == len(simulated) == s.iterations
        for row, sim in zip(steps, simulated, strict=True):
            assert row["empty"] is True and math.isnan(row["loss"])
            for key in ("k", "workers", "completed", "threshold", "drop_rate"):
                assert row[key] == sim[key], key
    assert results["empty"][0].record.summary["empty_steps"] == s.iterations


def dropcompute_sgd(s: Scenario, completed: list[list[int]]) -> torch.Tensor:
    """DropCompute Eq. (1): theta -= lr * (1/N) sum_n (1/M) sum of n's completed micro-batch
    gradients, with each round's completed counts as the run recorded them."""
    task, partition = world_data(s)
    theta, m = task.init_params(SEED), s.micro_batches
    for r, counts in enumerate(completed):
        batches = job_batches(partition, SEED, task.batch_size, np.arange(N), np.full(N, r), m)
        step = torch.zeros_like(theta)
        for n, c in enumerate(counts):
            for u in range(c):
                step += batch_gradient(task, theta, batches[n, u]) / (m * N)
        theta = theta - 0.1 * step
    return theta


@pytest.mark.timeout(120)
def test_dropped_micro_batches_leave_the_average_as_in_eq_1(results):
    result = results["preempt"][0]
    completed = [row["completed"] for row in result.record.steps]
    expected = dropcompute_sgd(CASES["preempt"][0], completed).numpy()
    np.testing.assert_allclose(result.theta, expected, rtol=1e-5, atol=1e-6)


# ---- (c) Algorithm 2 on gathered measurements ------------------------------------------------
@pytest.mark.timeout(120)
def test_every_rank_computes_the_same_tau_star(results):
    thresholds = [[row["threshold"] for row in r.record.steps] for r in results["auto"]]
    assert all(t == thresholds[0] for t in thresholds)
    calibrating, calibrated = thresholds[0][:3], thresholds[0][3:]
    assert all(t is None or math.isinf(t) for t in calibrating)
    assert len(set(calibrated)) == 1 and 0 < calibrated[0] < math.inf


# ---- (d) a static rule's rounds are accounted with their record rows ---------------------------
@pytest.fixture
def one_rank(sigterm):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield Collectives(0, 1, torch.device("cpu"), grace=0.0)
    dist.destroy_process_group()


#: a row's columns that no clock moves
DECIDED = ("step", "k", "lr", "loss", "workers", "staleness", "threshold", "completed", "s_eff")


def one_rank_run(comm: Collectives, strategy: str = "sync"):
    s = Scenario(task="logreg", workers=1, iterations=5, eval_every=2)
    return train_allreduce(TrainConfig(scenario=s, strategy=strategy, seed=SEED, timeout=30), comm)


@dataclass(frozen=True)
class Counting(Sync):
    """sync, counting its selections."""

    calls: list = field(default_factory=list)

    def select(self, state, arrivals: ArrivalColumns) -> Selection:
        self.calls.append(len(arrivals))
        return super().select(state, arrivals)


@pytest.mark.timeout(60)
def test_a_static_rules_rounds_are_selected_with_their_rows_as_if_at_once(one_rank, monkeypatch):
    """sync keeps its state: its rounds update with the own consultation's divisor and are
    selected over all ranks, checked and adapted later, with their rows; the parameters and
    every row are those of accounting each round at once."""
    rule = Counting()
    monkeypatch.setattr(config, "parse_strategy", lambda text: rule)
    selections_at_update = []
    apply = allreduce.apply
    monkeypatch.setattr(
        allreduce, "apply", lambda *a: (selections_at_update.append(len(rule.calls)), apply(*a))
    )
    late = one_rank_run(one_rank)
    assert selections_at_update == [1] * 5  # the own consultation only, asked once
    assert len(rule.calls) == 1 + 5  # then each round's selection, with its row
    monkeypatch.setattr(RuleDriver, "keeps_state", property(lambda self: False))
    at_once = one_rank_run(one_rank)
    assert np.array_equal(late.theta, at_once.theta)
    assert len(late.record.steps) == 5 and len(late.record.evals) == len(at_once.record.evals)
    for a, b in zip(late.record.steps, at_once.record.steps, strict=True):
        assert {k: a[k] for k in DECIDED} == {k: b[k] for k in DECIDED}


@dataclass(frozen=True)
class ByComputeTime(Sync):
    """A static rule that weighs an arrival by its compute seconds, not by its counts."""

    def select(self, state, arrivals: ArrivalColumns) -> Selection:
        return Selection(now=Weighting(arrivals.keys, arrivals.finish - arrivals.start))


@pytest.mark.timeout(60)
def test_a_static_rule_weighing_more_than_the_counts_is_refused_and_rows_stay_single(
    one_rank, monkeypatch
):
    """The own weight is asked once per state and count: a rule whose weight moves with the
    compute time gets round 0's weight in round 1, which its accounting refuses, naming the
    round. Round 0's row is recorded once, though the failure path records rows again."""
    rule = ByComputeTime("by-compute-time")
    monkeypatch.setattr(config, "parse_strategy", lambda text: rule)
    records = []
    close = allreduce.close_record
    monkeypatch.setattr(allreduce, "close_record", lambda r: (records.append(r), close(r)))
    with pytest.raises(TailtrainError, match=r"round 1: .*own counts"):
        one_rank_run(one_rank)
    assert [row["step"] for row in records[0].steps] == [0]


# ---- a unit that cannot be cut -----------------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_trace_of_a_computation_runs_its_unit_in_flight_to_its_end(tmp_path):
    """A ``trace:`` of a real computation (``cut=no``): the unit tau finds running runs on to
    its end, uncounted, in ``train`` (which sleeps it whole) as in ``simulate``. The trace
    holds the partial sums of the ``preempt`` case (the first unit of worker w skewed by
    SKEWS[(w + i) % 3] in iteration i), so the decisions are that case's, the simulated
    rounds end at the cut units' ends (3 UNIT, not tau), and ``train`` writes each cut unit
    whole: its seconds are its time, no bound, and it did not count."""
    rows = [
        (i, w, u, UNIT + (SKEWS[(w + i) % 3] if u == 0 else 0.0))
        for i in range(PARITY_ROUNDS) for w in range(N) for u in range(2)
    ]  # fmt: skip
    path = tmp_path / "trace.csv"
    path.write_text(
        "iteration,worker,micro_batch,seconds\n"
        + "".join(f"{i},{w},{u},{s}\n" for i, w, u, s in rows)
    )
    spec = f"dropcompute:threshold={TAU}"
    s = scenario(delay=f"trace:path={path},cut=no", micro_batches=2, iterations=PARITY_ROUNDS)
    simulated = simulate(s, parse_strategy(spec), SEED).steps
    sleeps = simulate(replace(s, delay=f"trace:path={path},cut=yes"), parse_strategy(spec), SEED)
    assert decisions(sleeps.steps) == decisions(simulated)
    assert [r["compute_time"] for r in simulated] == pytest.approx([3 * UNIT] * PARITY_ROUNDS)
    assert [r["compute_time"] for r in sleeps.steps] == pytest.approx([TAU] * PARITY_ROUNDS)
    out = tmp_path / "run"
    flags = ["--task", "logreg", "--strategy", spec, "--workers", str(N), "--micro-batches", "2",
             "--iterations", str(PARITY_ROUNDS), "--seed", str(SEED), "--eval-every", "100",
             "--delay", s.delay, "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(["train", *flags]) == 0
    trained = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    same = [a == b for a, b in zip(decisions(trained), decisions(simulated), strict=True)]
    assert np.mean(same) >= 0.95
    trace = np.genfromtxt(out / "trace.csv", delimiter=",", names=True)
    names = trace.dtype.names or ()
    # every cut unit ran whole: recorded at its injected seconds or more, uncensored; only a
    # unit never started (the second, after a first that ran past tau) is censored
    cut = trace["seconds"] >= 0.3 - 1e-9
    assert cut.sum() >= PARITY_ROUNDS
    if "censored" in names:
        assert not trace["censored"][cut].any()
        assert (trace["seconds"][trace["censored"] > 0] == 0).all()
    # its units slept, yet could not be cut: its own trace reads so, and replays as it ran
    machine = json.loads((out / "machine.jsonl").read_text().splitlines()[-1])
    assert machine["asleep"] > 0.9 and machine["cut"] is False
    assert not parse_delay(f"trace:path={out / 'trace.csv'}").cuttable
