"""The parameter-server simulator: conformance, determinism, theory and LGC's accounting."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tailtrain.core.records import clean
from tailtrain.core.scenario import Scenario
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy

N = 4


def constant_scenario(**kw) -> Scenario:
    base = dict(task="logreg", workers=N, delay="const:value=1", iterations=12, eval_every=4)
    return Scenario(**{**base, **kw})


@pytest.mark.parametrize("strategy", ["k-sync:k=3", "k-async:k=2", "k-batch-async:k=3", "dbw"])
def test_same_seed_gives_bit_identical_record(strategy, tmp_path):
    scenario = constant_scenario(delay="exp:rate=1", iterations=15)
    runs = []
    for i in range(2):
        record = simulate(scenario, parse_strategy(strategy), seed=3)
        record.write(tmp_path / str(i))
        runs.append([(tmp_path / str(i) / f).read_bytes() for f in ("steps.jsonl", "evals.jsonl")])
    assert runs[0] == runs[1]
    other = simulate(scenario, parse_strategy(strategy), seed=4)
    assert json.dumps(clean(other.steps)) != runs[0][0].decode().replace("\n", "")


def timing_only(strategy: str, delay: str, workers: int, iterations: int, seed: int = 1):
    scenario = Scenario(task="none", workers=workers, delay=delay, iterations=iterations)
    record = simulate(scenario, parse_strategy(strategy), seed)
    return np.diff(np.concatenate([[0.0], record.column("time")]))


def assert_mean_within(samples: np.ndarray, expected: float, sigmas: float = 4.0) -> None:
    """The sample mean is within ``sigmas`` standard errors (from the samples) of ``expected``."""
    se = samples.std(ddof=1) / np.sqrt(samples.size)
    assert abs(samples.mean() - expected) <= sigmas * se, (samples.mean(), expected, se)


@pytest.mark.parametrize(
    ("k", "delay", "shift", "rate"),
    [
        (5, "exp:rate=2", 0.0, 2.0),
        (16, "exp:rate=1", 0.0, 1.0),
        (10, "shifted-exp:shift=0.5,rate=1.5", 0.5, 1.5),
    ],
)
def test_k_sync_iteration_time_matches_order_statistic(k, delay, shift, rate):
    p = 16
    times = timing_only(f"k-sync:k={k}", delay, p, 4000)
    exact = shift + sum(1.0 / (i * rate) for i in range(p - k + 1, p + 1))  # E[X_{K:P}]
    assert_mean_within(times, exact)


def test_k_sync_matches_theory_module():
    from tailtrain.delays import parse_delay
    from tailtrain.theory import expected_order_stat

    times = timing_only("k-sync:k=6", "shifted-exp:shift=1,scale=0.5", 12, 4000)
    assert_mean_within(
        times, expected_order_stat(parse_delay("shifted-exp:shift=1,scale=0.5"), 6, 12).value
    )


def test_k_batch_async_iteration_time_is_k_mean_over_p_for_pareto():
    # Pareto shape 3 has finite variance; slow-and-stale Lemma 5: E[T] = K E[X] / P
    p, k, shape, scale = 8, 3, 3.0, 1.0
    times = timing_only(f"k-batch-async:k={k}", f"pareto:shape={shape},scale={scale}", p, 20000)
    mean_x = shape * scale / (shape - 1)
    # successive iteration times are dependent; batch means make the standard error honest
    batches = times[1000:].reshape(-1, 100).mean(axis=1)
    assert_mean_within(batches, k * mean_x / p)


def batch_means(times: np.ndarray, size: int = 100, burn_in: int = 200) -> np.ndarray:
    """Means of consecutive batches: nearly independent, so their spread gives an honest
    standard error for dependent iteration times."""
    kept = times[burn_in:]
    return kept[: kept.size // size * size].reshape(-1, size).mean(axis=1)


def exp_order_stat(k: int, p: int, rate: float) -> float:
    """E[X_{K:P}] for Exp(rate): sum_{i=P-K+1}^{P} 1/(i rate) (slow-and-stale Thm. 2)."""
    return sum(1.0 / (i * rate) for i in range(p - k + 1, p + 1))


@pytest.mark.parametrize(("k", "rate"), [(4, 1.0), (1, 2.0), (12, 1.0)])
def test_k_async_iteration_time_equals_k_sync_for_exponential(k, rate):
    # slow-and-stale Thm. 2 / Remark 2: equality in Lemma 3 for Exp(mu), E[T] = E[X_{K:P}];
    # a worker counting twice in a step would make it faster
    p = 16
    times = timing_only(f"k-async:k={k}", f"exp:rate={rate:g}", p, 4000)
    assert_mean_within(batch_means(times), exp_order_stat(k, p, rate))


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_k_async_shifted_exponential_within_lemma_3_and_4_bounds(shift):
    p, k, rate = 16, 4, 1.0
    delay = f"shifted-exp:shift={shift:g},rate={rate:g}"
    batches = batch_means(timing_only(f"k-async:k={k}", delay, p, 4000))
    se = batches.std(ddof=1) / np.sqrt(batches.size)
    lemma3 = shift + exp_order_stat(k, p, rate)  # E[T] <= E[X_{K:P}] (Eq. 11)
    n = p // k  # Lemma 4 (Eq. 12), P = nK: n iterations take <= shift + sum E[X~_{K:P-iK}]
    lemma4 = (shift + sum(exp_order_stat(k, p - i * k, rate) for i in range(n))) / n
    assert batches.mean() <= min(lemma3, lemma4) + 4 * se
    # and no schedule beats P workers' throughput: K gradients need K E[X] / P (Lemma 5)
    assert batches.mean() >= k * (shift + 1 / rate) / p - 4 * se


def test_lgc_complete_stragglers_are_charged_their_time():
    # stragglers finish their whole gradient before the next update: never k-sync's time
    lgc = timing_only("lgc:k=4,complete=true", "exp:rate=1", 8, 400)
    k_sync = timing_only("k-sync:k=4", "exp:rate=1", 8, 400)
    assert lgc.sum() >= 1.5 * k_sync.sum()


class LinearTask:
    """loss_w(theta) = <a_w, theta>: gradients that do not depend on the model (LGC test)."""

    has_model = True
    batch_size = 4
    metric_name = "none"

    def __init__(self, vectors: torch.Tensor) -> None:
        self.vectors = vectors
        self.n_train, self.dim = vectors.shape

    def init_params(self, seed):
        return torch.zeros(self.dim, dtype=torch.float64)

    def train_labels(self):
        return None

    n_classes = None

    def grads(self, theta, indices):
        # one example per worker (iid shards of n examples for n workers)
        rows = torch.as_tensor(indices[:, 0], dtype=torch.long)
        g = self.vectors[rows]
        return (g * theta).sum(1), g.clone()

    def evaluate(self, theta):
        return {"train_loss": 0.0, "eval": 0.0, "eval_loss": 0.0}


class StragglerDelays:
    """Worker n-1 takes 3 s, everyone else 1 s, every job."""

    def __init__(self, n):
        self.n = n

    def next_block(self, iterations):
        times = np.ones((iterations, self.n))
        times[:, -1] = 3.0
        return times

    def time_factor(self, starts, workers):
        return np.ones(len(workers))


def test_lgc_sums_to_full_sync_up_to_the_pending_compensation():
    n, steps, lr = 5, 9, 0.1
    vectors = torch.arange(n * 3, dtype=torch.float64).reshape(n, 3) ** 1.5
    task = LinearTask(vectors)
    captured = {}
    orig = task.evaluate

    def evaluate(theta):
        captured["theta"] = theta.clone()
        return orig(theta)

    task.evaluate = evaluate
    scenario = Scenario(
        task="logreg", workers=n, partition="iid", iterations=steps, lr=lr, eval_every=1000
    )
    from tailtrain.sim.ps.trainer import Trainer

    strategy = parse_strategy(f"lgc:k={n - 1},blocks=4,complete=true")
    made = []
    real_of = Trainer.of

    def spy(world):
        made.append(real_of(world))
        return made[-1]

    Trainer.of = spy
    try:
        simulate(scenario, strategy, 0, task=task, delays=StragglerDelays(n))
    finally:
        Trainer.of = real_of
    pending = made[0].update.deferred
    full_sync = vectors.mean(0)
    expected = -lr * (steps * full_sync - pending)
    torch.testing.assert_close(captured["theta"], expected)
    # LGC Eq. (7) for the one straggler s: (1/N) g_s - ((N-K)/N) * mean of the K others
    candidates = [(vectors[s] - (vectors.sum(0) - vectors[s]) / (n - 1)) / n for s in range(n)]
    assert any(torch.allclose(pending, c) for c in candidates)
    assert not torch.allclose(pending, torch.zeros_like(pending))
