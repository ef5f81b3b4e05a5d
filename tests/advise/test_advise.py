"""`tailtrain.advice`: verdicts, the straggler cost and the recommendation, on generated traces."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from tailtrain.advice import advise
from tailtrain.advice.cost import sync_cost
from tailtrain.advice.stragglers import score_workers
from tailtrain.delays.trace import comm_note, replayed_comm
from tailtrain.prediction.families import row_spec
from tailtrain.strategies.registry import parse_strategy


def test_the_always_slow_worker_is_the_only_persistent_one(slow_trace):
    path, times = slow_trace
    found = advise(path)
    assert found.persistent == [3]
    slowest = next(s for s in found.stragglers if s.worker == 3)
    assert slowest.score == min(s.score for s in found.stragglers)
    # the saving from excluding worker 3, from the definitions: E[max over the 15 others]
    saving = times.max(axis=1).mean() - np.delete(times, 3, axis=1).max(axis=1).mean()
    assert found.cost.iteration_time == pytest.approx(times.max(axis=1).mean())
    assert found.cost.mean_worker_time == pytest.approx(times.mean())
    assert "sync's step without worker(s) 3 is" in found.reason
    assert f"{saving:.4g} s shorter" in found.reason
    assert "their samples gone with them" in found.reason
    parse_strategy(found.recommendation)
    # predict's note on its rebalance row (this trace is not i.i.d.) has no row here to explain
    shown = {r.row.strategy for r in found.ranked}
    assert "rebalance" not in shown
    assert not any(note.startswith("rebalance:") for note in found.notes)


def test_no_persistent_verdict_without_a_persistent_straggler(clean_trace):
    found = advise(clean_trace)
    assert found.persistent == [] and found.without_persistent is None
    assert "excluding" not in found.reason


def test_score_is_against_the_others_median_and_the_sign_test_is_binomial(helpers):
    _, noisy = helpers
    times = noisy("lognormal", (60, 8), seed=3)
    times[:, 5] *= 1.5
    scores = score_workers(times, np.arange(8))
    for s in scores:
        others = np.median(np.delete(times, s.worker, axis=1), axis=1)
        ratio = times[:, s.worker] / others
        assert s.slowdown == pytest.approx(np.median(ratio))
        own = np.median(times[:, s.worker])
        assert s.score == pytest.approx(min(np.median(others) / own, 1.0))
        slower = int((ratio > 1).sum())
        expected = stats.binomtest(slower, 60, 0.5, alternative="greater").pvalue
        assert s.p_value == pytest.approx(expected)
    assert [s.worker for s in scores if s.verdict != "healthy"] == [5]


def test_intermittent_worker(helpers):
    """A worker 4x slower in a fifth of its iterations, fine otherwise: not persistent."""
    _, noisy = helpers
    times = noisy("lognormal", (200, 12), seed=4)
    times[::5, 7] *= 4
    verdicts = {s.worker: s.verdict for s in score_workers(times, np.arange(12))}
    assert verdicts[7] == "intermittent"
    assert [w for w, v in verdicts.items() if v != "healthy"] == [7]


def test_cost_with_more_workers_replays_worker_n_mod_w(helpers):
    _, noisy = helpers
    times = noisy("lognormal", (50, 4), seed=5)
    cost = sync_cost(times, np.arange(4), 10)  # replicas 3, 3, 2, 2
    weights = np.array([3, 3, 2, 2])
    assert cost.iteration_time == pytest.approx(times.max(axis=1).mean())
    assert cost.mean_worker_time == pytest.approx((times.mean(axis=0) * weights).sum() / 10)
    fewer = sync_cost(times, np.arange(4), 2)
    assert fewer.iteration_time == pytest.approx(times[:, :2].max(axis=1).mean())


def test_extrapolation_to_a_million_workers_and_short_traces(tmp_path, helpers):
    write_trace, noisy = helpers
    times = noisy("lognormal", (20, 8), seed=6)
    times[:, 2] *= 3
    found = advise(write_trace(tmp_path / "t.csv", times), workers=10**6)
    assert any("too short to trust" in note for note in found.notes)
    assert any("mod 8" in note for note in found.notes)
    sync = next(r for r in found.ranked if r.row.strategy == "sync")
    assert sync.row.iteration_time == pytest.approx(times.max(axis=1).mean())
    parse_strategy(found.recommendation)


def charged(path, times, comm):
    """A trace with ``noncompute`` as ``train`` writes it: the slowest worker's is T^c[i]."""
    iterations, workers = times.shape
    lines = ["iteration,worker,seconds,noncompute"]
    for i in range(iterations):
        slowest = times[i].max()
        for w in range(workers):
            lines.append(
                f"{i},{w},{float(times[i, w])!r},{float(comm[i] + slowest - times[i, w])!r}"
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_advise_prices_the_recorded_communication_unless_told_otherwise(tmp_path, helpers, capsys):
    _, noisy = helpers
    times = noisy("lognormal", (60, 4), seed=7)
    comm = np.random.default_rng(8).uniform(0.2, 0.4, 60)
    path = charged(tmp_path / "t.csv", times, comm)
    found = advise(path, samples=200)  # 2-20 s by load: every strategy is simulated
    expected = times.max(axis=1).mean() + comm.mean()
    sync = next(r for r in found.ranked if r.row.strategy == "sync")
    # the text quotes the table's sync row, whose T^c draws the recorded rounds at random
    assert found.cost.iteration_time == sync.row.iteration_time
    assert found.cost.iteration_time == pytest.approx(expected, rel=0.03)
    assert found.cost.comm_time == pytest.approx(comm.mean())
    assert found.cost.overhead == pytest.approx(
        found.cost.iteration_time - comm.mean() - times.mean()
    )
    assert any(note.startswith("T^c replayed from the trace") for note in found.notes)
    from tailtrain.cli.advise import _print

    _print(found)  # the text names the figure the table shows where sync's row is simulated
    assert sync.simulated is not None
    said = f"(the trace replayed; simulated, the table's sync row reads {sync.iteration_time:.4g}"
    assert said in capsys.readouterr().out
    delay = f"trace:path={path}"
    assert replayed_comm(delay, "0.1") == "0.1"  # what advise(comm_time="0.1") prices
    assert "from --comm-time 0.1" in comm_note(delay, "0.1")
    out = found.to_json()
    assert out["recommendation"] == out["equivalent"][0]
    assert all(r["effective_speedup_uncertainty"] >= 0 for r in out["results"])
    assert any(r["effective_speedup_uncertainty"] > 0 for r in out["results"])


def ranked_row(spec: str, speedup: float, uncertainty: float):
    from tailtrain.advice.recommend import Ranked
    from tailtrain.prediction import Row

    strategy, _, setting = spec.partition(":")
    k = int(setting.rpartition("=")[2]) if strategy in ("k-sync", "k-batch-sync") else 8
    row = Row(strategy, k, 1.0, 0.0, speedup, speedup, 0.0, "test", spec=spec)
    return Ranked(row, None, uncertainty)


def test_forecasts_within_their_uncertainty_are_equivalent_and_the_simplest_is_chosen():
    from tailtrain.advice.recommend import equivalents, recommend

    rows = [
        ranked_row("async", 1.60, 0.01),  # stale gradients: never recommended
        ranked_row("local-sgd:period=8", 1.30, 0.03),
        ranked_row("local-sgd:period=4", 1.27, 0.03),
        ranked_row("local-sgd:period=2", 1.25, 0.03),  # 0.05 > hypot(0.03, 0.03): apart
        ranked_row("k-sync:k=6", 1.28, 0.02),
        ranked_row("sync", 1.00, 0.03),
    ]
    assert [row_spec(r.row) for r in equivalents(rows)] == [
        "k-sync:k=6",
        "local-sgd:period=4",
        "local-sgd:period=8",
    ]
    # a noisy rerun that swaps the order within the uncertainty gives the same advice
    noisier = [*rows[:1], ranked_row("local-sgd:period=8", 1.27, 0.03), *rows[2:3]]
    noisier += [ranked_row("local-sgd:period=4", 1.29, 0.03), *rows[3:]]
    for found in (rows, noisier):
        assert row_spec(recommend(found)[0].row) == "k-sync:k=6"
    far = [ranked_row("local-sgd:period=8", 1.50, 0.01), *rows[2:]]
    assert row_spec(recommend(far)[0].row) == "local-sgd:period=8"
    # where persistent stragglers dominate, a tied rebalance row comes first (issue 25)
    tied = [*rows, ranked_row("rebalance", 1.29, 0.02)]
    assert row_spec(recommend(tied)[0].row) == "k-sync:k=6"
    assert row_spec(recommend(tied, persistent_dominate=True)[0].row) == "rebalance"


def test_a_forecasts_uncertainty_holds_the_run_to_run_spread_and_the_models_error():
    """Two standard errors of the replay, the trace's length and the blocks' spread in
    quadrature, then the model's own error (module docstring of ``advice.recommend``)."""
    from tailtrain.advice.recommend import MODEL_ERROR, uncertainty
    from tailtrain.prediction import Row

    row = Row("local-sgd", 4, 1.0, 0.0, 1.25, 1.25, 0.0, "test", spec="local-sgd:period=8")
    row = dataclasses.replace(row, effective_speedup_stderr=0.01)
    blocks = [1.15, 1.35]  # two halves, each a run half as long: SE of the whole = 0.1 / 1
    stat = 2 * math.hypot(0.01, 0.04 * 0.25, 0.1)
    expected = math.hypot(stat, MODEL_ERROR * 1.25)
    assert uncertainty(row, None, 0.04, blocks) == pytest.approx(expected)
    assert uncertainty(row, None, 0.04) == pytest.approx(
        math.hypot(2 * math.hypot(0.01, 0.04 * 0.25), MODEL_ERROR * 1.25)
    )
    sync = dataclasses.replace(row, strategy="sync", effective_speedup=1.0)
    assert uncertainty(sync, None, 0.04) == pytest.approx(2 * 0.01)  # 1 by definition


@pytest.mark.slow
def test_identical_runs_get_the_same_advice(tmp_path):
    """Three traces of one law (three identical runs, by seed) get one recommendation, and
    every forecast but sync's carries the model's error and its blocks' spread (issue 23).
    ~15 s of CPU: three whole advises, the point of the test."""
    from tailtrain.advice.recommend import MODEL_ERROR

    picks = []
    for seed in (21, 22, 23):
        times = np.random.default_rng(seed).lognormal(0.0, 0.25, (40, 4))
        comm = np.random.default_rng(seed + 100).uniform(0.1, 0.2, 40)
        found = advise(charged(tmp_path / f"t{seed}.csv", times, comm), samples=200)
        picks.append(found.recommendation)
        for r in found.ranked:
            floor = 0.0 if r.row.strategy == "sync" else MODEL_ERROR * r.effective_speedup
            assert r.uncertainty >= floor - 1e-12
    assert len(set(picks)) == 1, picks


def test_a_trace_of_a_computation_is_priced_with_its_unit_in_flight_run_to_its_end(tmp_path):
    """``train``'s machine row says its units were a computation (``asleep`` 0): advise's
    DropCompute rows, its blocks and its splits all let the unit in flight at tau run to its
    end (``cut=no``), which costs time that a sleep cut at tau would not, and check tau
    between units (``stop=between``, as the hook does), which counts that unit; the same
    trace with nothing beside it keeps the sleeps' pricing."""
    from tests.cli.helpers import spiky_micro_batch_trace

    from tailtrain.delays.trace import cut_option, read_trace

    text = spiky_micro_batch_trace()
    computed, slept = tmp_path / "computed", tmp_path / "slept"
    for folder in (computed, slept):
        folder.mkdir()
        (folder / "trace.csv").write_text(text)
    row = '{"run": 0, "host": "h", "cores": 4, "local_ranks": 4, "load": [1.0], "asleep": 0.0}'
    (computed / "machine.jsonl").write_text(row + "\n")
    assert cut_option(computed / "trace.csv", read_trace(computed / "trace.csv")) == ",cut=no"
    assert cut_option(slept / "trace.csv", read_trace(slept / "trace.csv")) == ""

    def dropcompute(folder, **kw):
        found = advise(folder / "trace.csv", samples=400, **kw)
        return next(r for r in found.ranked if r.row.strategy == "dropcompute")

    run_on, cut = dropcompute(computed), dropcompute(slept)
    assert run_on.simulated.iteration_time > cut.simulated.iteration_time
    assert run_on.effective_speedup < cut.effective_speedup
    # such units are checked between: as late, and the unit in flight counts
    assert row_spec(run_on.row).endswith(",stop=between")
    assert "stop=" not in row_spec(cut.row)
    # read as replica groups, the trace is written again elsewhere: it keeps what it was
    run_on, cut = dropcompute(computed, group_size=2), dropcompute(slept, group_size=2)
    assert run_on.simulated.iteration_time > cut.simulated.iteration_time


def test_a_replayed_e_t_below_the_direct_mean_is_no_negative_wait():
    """The table's replayed E[T] can fall a little below the direct mean worker time plus
    T^c (a rebalanced run, every rank nearly as long): no worker waits there, 0, not -2%."""
    from tailtrain.advice.cost import Cost

    cost = Cost(workers=2, iteration_time=0.0016, mean_worker_time=0.0011, comm_time=0.0006)
    assert cost.overhead == 0.0 and cost.overhead_share == 0.0
    assert Cost(2, 0.002, 0.0011, comm_time=0.0006).overhead == pytest.approx(0.0003)
