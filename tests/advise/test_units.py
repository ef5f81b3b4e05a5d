"""Advice in the user's units on probe-like traces (samples, noncompute, runs)."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.advice import advise
from tailtrain.advice.units import WARMUP_STEPS, JobShape, measured_rate
from tailtrain.core.machine import append_machine, machine_row
from tailtrain.delays.trace import read_trace, write_trace_rows
from tailtrain.errors import UsageError
from tailtrain.strategies.rebalance import optimal_shares


def probe_trace(path, runs=((32, 32),), slow=3.0, steps=60, seed=0):
    """2 ranks, rank 1 ``slow`` x slower per sample; each run deals its shares."""
    rng = np.random.default_rng(seed)
    rows = []
    for run, shares in enumerate(runs):
        for i in range(steps):
            # noise small enough that the fitted ratio stays near 3 (48/16 flips at 3.06)
            per = np.array([0.05, 0.05 * slow]) / 32 * rng.lognormal(0, 0.05, 2)
            seconds = per * np.array(shares)
            wall = seconds.max() + 0.004
            rows += [[i, w, seconds[w], wall - seconds[w], shares[w], run] for w in range(2)]
    write_trace_rows(path, np.array(rows), False, noncompute=True, samples=True, run=True)
    return path


def with_an_unknown_count(path):
    """The trace at ``path`` with rank 0's count of step 5 unknown (0, as the probe writes)."""
    trace = read_trace(path)
    trace.samples[(trace.iteration == 5) & (trace.worker == 0)] = 0
    rows = np.column_stack([trace.iteration, trace.worker, trace.seconds, trace.noncompute,
                            trace.samples, trace.run])  # fmt: skip
    write_trace_rows(path, rows, False, noncompute=True, samples=True, run=True)
    return path


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    path = probe_trace(tmp_path_factory.mktemp("units") / "trace.csv")
    return path, advise(path, setup="ddp", samples=400)


def test_a_persistent_straggler_in_a_ddp_job_gets_shares_from_the_one_rule(straggler):
    path, found = straggler
    assert found.recommendation == "rebalance"
    trace = read_trace(path)
    per_sample = [np.median(trace.seconds[trace.worker == w] / 32) for w in (0, 1)]
    assert found.choice.shares == tuple(optimal_shares(np.array(per_sample), 64, 1))
    assert found.choice.shares == (48, 16)
    assert "rebalance_loader(loader, shares=[48, 16])" in found.adopt.lines()[1]
    # sync's step waits for rank 1's 32 samples (0.15 s), rebalance's for 48 or 3 x 16
    # (0.075 s), each plus T^c 0.004 s
    assert found.choice.effective_speedup == pytest.approx(0.154 / 0.079, rel=0.1)
    payload = found.to_json()
    row = next(r for r in payload["results"] if r["spec"] == "rebalance")
    assert row["samples_applied_per_second"] == pytest.approx(
        row["samples_applied_ratio"] * measured_rate(trace)[0]
    )
    exclusion = payload["exclusion"]
    assert exclusion["excluded"] == [1]
    # rank 0 alone applies its 32 of the 64 samples at its own pace; a replacement at that
    # pace keeps all 64: twice the rate, sync's 0.154 s step over rank 0's 0.054 s
    assert exclusion["replaced_ratio"] == pytest.approx(2 * exclusion["samples_applied_ratio"])
    assert exclusion["replaced_ratio"] == pytest.approx(0.154 / 0.054, rel=0.15)


def test_a_persistent_straggler_in_a_trainer_job_gets_the_trainer_subclass(straggler):
    """``--for hf`` ranks as a DDP job, and its rebalance is one line inside the Trainer
    (``RebalancedTrainer``, the same shares), not a DDP loop's lines to move to."""
    path, ddp = straggler
    found = advise(path, setup="hf", samples=400)
    assert found.recommendation == "rebalance" and found.choice.shares == ddp.choice.shares
    assert found.adopt.lines() == [
        "from tailtrain.hf import RebalancedTrainer",
        "trainer = RebalancedTrainer(..., shares=[48, 16])  "
        "# was: Trainer(...), per_device_train_batch_size=32",
        "# a Trainer subclass of your own: derive it from RebalancedTrainer, the same shares=",
    ]


def test_dropcompute_on_a_one_batch_step_states_the_m_it_needs(straggler):
    _, found = straggler
    rows = [r for r in found.ranked if r.row.strategy == "dropcompute"]
    assert len(rows) == 1 and rows[0].micro_batches in (2, 4, 8)
    assert found.to_json()["results"][found.ranked.index(rows[0])]["micro_batches"] in (2, 4, 8)


def test_before_and_after_in_the_same_units(tmp_path):
    path = probe_trace(tmp_path / "trace.csv", runs=((32, 32), (48, 16)))
    found = advise(path, setup="ddp", samples=400)
    report = found.before_after()
    trace = read_trace(path)
    before, after = (measured_rate(trace.of_run(r))[0] for r in (0, 1))
    assert report["last_over"]["0"] == pytest.approx(after / before)
    assert after / before == pytest.approx(2.0, rel=0.15)
    # each run says the batches it dealt, so a list of runs tells which ran the shares
    assert [r.samples for r in found.runs] == [(32, 32), (48, 16)]
    assert report["runs"][1]["samples_per_rank"] == [48, 16]
    # judged per sample: the rebalanced rank 1 is still the slow one
    assert [s.verdict for s in found.runs[1].verdicts] == ["healthy", "persistent"]
    assert found.recommendation == "sync"  # the last run already deals the shares
    # which sync's row keeps: the lines say so, not that the loop runs plain sync
    assert found.job.dealt == (48, 16) and found.to_json()["job"]["dealt"] == [48, 16]
    assert found.adopt.lines() == [
        "# keep your job as it is: it deals its shares [48, 16], which no row beats"
    ]


def test_micro_batches_on_a_per_step_trace_is_no_longer_refused(straggler):
    path, _ = straggler
    found = advise(path, setup="ddp", samples=400, micro_batches=4)
    assert any("per-step trace" in note for note in found.notes)
    assert all(r.micro_batches in (None, 4) for r in found.ranked)


def test_a_step_with_an_unknown_count_keeps_the_verdict_per_sample(tmp_path):
    """advise judges by the probe's one normalisation (``persistence.per_sample_times``): a
    step the probe wrote with 0 samples (a count it did not know) is left out, not a reason
    to judge the rebalanced job per step, where its slow rank looks healthy."""
    path = with_an_unknown_count(probe_trace(tmp_path / "trace.csv", runs=((48, 16),)))
    found = advise(path, setup="ddp", samples=200)
    assert [s.verdict for s in found.stragglers] == ["healthy", "persistent"]


def test_the_rebalanced_step_is_each_recorded_steps_slowest_share():
    """Each recorded step rebalanced: max_n b_n t_n of that step's per-sample times (its
    ranks slow together on odd steps), not shares cut from streams that mix steps."""
    from tailtrain.advice.units import rebalance_shares
    from tailtrain.delays.trace import Trace

    c, steps = 1e-3, 40
    per = np.array([[1.0, 3.0], [2.0, 6.0]] * (steps // 2)) * c  # seconds per sample
    found = rebalance_shares(
        Trace(
            np.repeat(np.arange(steps), 2),
            np.tile([0, 1], steps),
            None,
            (per * 32).ravel(),
            samples=np.full(2 * steps, 32),
        ),
        comm=0.004,
    )
    assert tuple(found.shares) == (48, 16)
    assert found.iteration_time == pytest.approx((48 + 96) / 2 * c + 0.004)


def test_the_warm_up_steps_are_left_out_of_the_rebalanced_step():
    """DDP's second step rebuilds its buckets, and rank 0 waits for the slow rank inside what
    the probe times as compute: scaled up to rank 0's larger share, that wait inflated the
    forecast step (bench_loop's scenario b: 0.87-0.92x the realised). The first
    ``WARMUP_STEPS`` steps price nothing; the fit and replay see the steps after them."""
    from tailtrain.advice.units import rebalance_shares
    from tailtrain.delays.trace import Trace

    c, steps = 1e-3, 40
    per = np.array([[1.0, 3.0]] * steps) * c
    per[1, 0] = 3.0 * c  # rank 0's step 1: its wait for rank 1 timed as compute
    per[0] *= 5.0  # the first forward's lazy set-up

    def shares_of(per):
        trace = Trace(np.repeat(np.arange(len(per)), 2), np.tile([0, 1], len(per)), None,
                      (per * 32).ravel(), samples=np.full(2 * len(per), 32))  # fmt: skip
        return rebalance_shares(trace, comm=0.004)

    found, steady = shares_of(per), shares_of(per[WARMUP_STEPS:])
    assert tuple(found.shares) == tuple(steady.shares) == (48, 16)
    assert found.iteration_time == pytest.approx(48 * c + 0.004)
    assert found.iteration_time == steady.iteration_time


def test_a_slow_first_step_changes_neither_the_measured_rate_nor_the_forecast(tmp_path):
    """A first step 20x the others (CUDA's set-up, a first forward): the rebalance replay
    leaves it out, and so must the job as measured that its ratio is taken over, or the
    ratio credits rebalance with the warm-up (a review's 1.91x read 2.52x)."""
    plain = probe_trace(tmp_path / "plain.csv")
    trace = read_trace(plain)
    trace.seconds[trace.iteration == 0] *= 20
    rows = np.column_stack([trace.iteration, trace.worker, trace.seconds, trace.noncompute,
                            trace.samples, trace.run])  # fmt: skip
    slow = tmp_path / "slow.csv"
    write_trace_rows(slow, rows, False, noncompute=True, samples=True, run=True)
    assert measured_rate(read_trace(slow)) == measured_rate(read_trace(plain))
    ratios = [advise(path, setup="ddp", samples=200).choice for path in (plain, slow)]
    assert ratios[0].shares == ratios[1].shares
    assert ratios[0].effective_speedup == pytest.approx(ratios[1].effective_speedup, rel=1e-9)


def test_a_short_trace_with_a_dominant_share_still_gets_a_forecast():
    from tailtrain.advice.units import rebalance_shares
    from tailtrain.delays.trace import Trace

    per = np.tile([0.001, 0.1, 0.1, 0.1], 2)  # 4 ranks, 2 steps, rank 0 100x faster
    trace = Trace(np.repeat([0, 1], 4), np.tile(np.arange(4), 2), None, per * 16,
                  samples=np.full(8, 16))  # fmt: skip
    found = rebalance_shares(trace, comm=0.0)
    assert found.shares.max() > 2 * 64 // 4  # more than two recorded steps' worth
    assert np.isfinite(found.iteration_time)


def test_a_step_with_an_unknown_count_is_left_out_of_the_shares(tmp_path):
    """The probe writes 0 samples for a step whose count it did not know: that step has no
    per-sample time (as ``per_sample_times`` leaves it out), and the others still price
    rebalance."""
    path = with_an_unknown_count(probe_trace(tmp_path / "trace.csv"))
    found = advise(path, setup="ddp", samples=200)
    assert found.recommendation == "rebalance" and found.choice.shares == (48, 16)


def test_one_micro_batch_on_a_per_step_trace_is_the_trace_itself(straggler):
    """``--micro-batches 1`` says what a probe's trace already is (one batch a step): advised
    as without it, DropCompute at the M it needs; 0 is refused like any M < 1."""
    path, found = straggler
    once = advise(path, setup="ddp", samples=400, micro_batches=1)
    assert once.recommendation == found.recommendation
    assert [r.micro_batches for r in once.ranked] == [r.micro_batches for r in found.ranked]
    with pytest.raises(UsageError, match="--micro-batches must be >= 1, got 0"):
        advise(path, setup="ddp", samples=400, micro_batches=0)


def test_rebalance_on_whole_batches_is_preferred_to_a_split_the_job_does_not_have(tmp_path):
    # 4 ranks, rank 3 always 3x slower per sample, heavy per-step noise on every rank:
    # DropCompute's forecast at M micro-batches beats rebalance's beyond the uncertainty,
    # but it leaves out what each extra micro-batch costs, which whole steps cannot show
    rng = np.random.default_rng(0)
    rows = []
    for i in range(60):
        seconds = 0.016 * np.array([1, 1, 1, 3.0]) * rng.lognormal(0, 0.8, 4)
        wall = seconds.max() + 0.002
        rows += [[i, w, seconds[w], wall - seconds[w], 32, 0] for w in range(4)]
    path = tmp_path / "trace.csv"
    write_trace_rows(path, np.array(rows), False, noncompute=True, samples=True, run=True)
    found = advise(path, setup="ddp", samples=400)
    split = next(r for r in found.ranked if r.row.strategy == "dropcompute")
    assert split.micro_batches is not None
    assert split.effective_speedup - split.uncertainty > found.choice.effective_speedup
    assert found.recommendation == "rebalance" and found.choice.micro_batches is None
    assert "splits each batch in micro-batches the job does not have" in found.reason
    assert "rebalance_loader" in found.adopt.lines()[1]


def test_a_ranks_fixed_seconds_are_fitted_on_an_epochs_short_last_batch():
    """Rank n's step a_n + c_n b: the short last batch of each epoch (3 samples here) tells
    the fixed part from the per-sample part; the shares then give the fast rank fewer than
    per-sample times alone would (its fixed 3 ms does not grow with its share), and the
    replay prices the step at those costs."""
    from tailtrain.advice.units import rebalance_shares, step_costs
    from tailtrain.delays.trace import Trace

    fixed, per_sample = np.array([0.003, 0.002]), np.array([0.0001, 0.0025])
    counts = np.array([32] * 28 + [3] * 1) * np.ones((6, 1), dtype=int)  # 6 epochs
    samples = np.repeat(counts.reshape(-1, 1), 2, axis=1)
    noise = np.random.default_rng(0).lognormal(0, 0.02, samples.shape)
    seconds = (fixed + per_sample * samples) * noise
    costs = step_costs(seconds, samples)
    assert costs.fitted.all()
    np.testing.assert_allclose(costs.fixed, fixed, rtol=0.1)
    np.testing.assert_allclose(costs.per_sample, per_sample, rtol=0.05)
    steps = samples.shape[0]
    trace = Trace(np.repeat(np.arange(steps), 2), np.tile([0, 1], steps), None, seconds.ravel(),
                  samples=samples.ravel())  # fmt: skip
    found = rebalance_shares(trace, comm=0.001)
    assert tuple(found.shares) == tuple(optimal_shares(per_sample, 64, 1, fixed=fixed))
    assert found.shares[1] < optimal_shares(np.median(seconds / samples, axis=0), 64, 1)[1]
    made = float((fixed + per_sample * found.shares).max()) + 0.001
    assert found.iteration_time == pytest.approx(made, rel=0.05)


def test_one_count_per_rank_keeps_the_step_proportional_to_its_samples():
    from tailtrain.advice.units import step_costs

    seconds = np.array([[0.01, 0.03], [0.012, 0.029], [0.011, 0.031]])
    costs = step_costs(seconds, np.full((3, 2), 32))
    assert not costs.fitted.any() and (costs.fixed == 0).all()
    np.testing.assert_allclose(costs.per_sample, np.median(seconds, axis=0) / 32)


def test_short_steps_that_ran_no_faster_keep_the_proportional_rule():
    """An epoch's short step that also paid for something else (an eval, a loader reset) is
    no slower per step than a full one: no line through it (a per-sample cost of 0 would
    divide the shares by zero), the step stays proportional to its samples."""
    from tailtrain.advice.units import step_costs

    samples = np.array([[32, 32]] * 10 + [[8, 8]] * 3)
    seconds = np.array([[1.0, 2.0]] * 10 + [[1.1, 2.2]] * 3)
    costs = step_costs(seconds, samples)
    assert not costs.fitted.any() and (costs.fixed == 0).all()
    np.testing.assert_allclose(costs.per_sample, [1 / 32, 2 / 32])
    shares = optimal_shares(costs.per_sample, 64, 1, fixed=costs.fixed)
    assert shares.sum() == 64 and (shares >= 1).all()


def lump_trace(path, lump=0.030, per_sample=0.00003, epochs=4, seed=0):
    """2 ranks, the same seconds per sample, rank 1 ``lump`` s more once a step (a sleep
    before its forward, as a newcomer's trial slowed it), epochs of 28 batches of 32 samples
    and a short last one of 5, so the fixed part can be fitted."""
    rng = np.random.default_rng(seed)
    rows, i = [], 0
    for _ in range(epochs):
        for b in [32] * 28 + [5]:
            seconds = (np.array([0.001, 0.001 + lump]) + per_sample * b) * rng.lognormal(0, 0.05, 2)
            wall = seconds.max() + 0.002
            rows += [[i, w, seconds[w], wall - seconds[w], b, 0] for w in range(2)]
            i += 1
    write_trace_rows(path, np.array(rows), False, noncompute=True, samples=True, run=True)
    append_machine(path.parent, machine_row(0, 2) | {"cut": False})  # as the probe says
    return path


def test_a_per_step_lump_stays_whole_in_the_split_and_dropcompute_is_not_priced_cutting_it(
    tmp_path,
):
    """Rank 1's 30 ms a step does not scale with its samples (fitted on the epochs' short
    batches): splitting the batch in M micro-batches leaves it whole, so the split keeps it in
    the first micro-batch, which always runs, and DropCompute is priced as cutting only the
    rest. Split M ways with the rest, it was priced at 1.68x where the job ran 0.80x."""
    from tailtrain.advice.units import fixed_seconds, split_trace

    path = lump_trace(tmp_path / "trace.csv")
    trace = read_trace(path)
    assert fixed_seconds(trace)[1] == pytest.approx(0.031, rel=0.1)
    split = read_trace(split_trace(trace, 8, tmp_path / "split.csv"))
    first = split.micro_batch == 0
    slow = split.worker == 1
    assert split.seconds[first & slow].min() > 0.028  # the lump, whole, in every step's first
    rest = np.bincount(split.iteration[~first & slow], split.seconds[~first & slow])
    assert rest.max() < 0.015  # the other 7 share what is left of each step: ~2-4 ms
    found = advise(path, setup="ddp", samples=400)
    dropcompute = [r for r in found.ranked if r.row.strategy == "dropcompute"]
    assert len(dropcompute) == 1 and dropcompute[0].effective_speedup < 1.1
    # rebalance's 1.07x ties with sync within its uncertainty: no remedy, the job as it runs
    rebalance = next(r for r in found.ranked if r.row.strategy == "rebalance")
    assert rebalance.effective_speedup - rebalance.uncertainty < 1.0
    assert found.recommendation == "sync"


def test_a_run_the_probe_saw_under_dropcompute_is_read_as_that_job(tmp_path):
    """The probe's row says the run ran under DropCompute at M=2 (``remedy``): advise reads
    the job at that M and says so first; rank 1's computed samples, 16 of 32, are the cut,
    not shares, so no rebalance row deals them as a global batch (a newcomer's trial got
    shares [39, 1] of the 40 samples computed, where the job deals 64)."""
    probe_trace(tmp_path / "trace.csv", runs=((32, 16),), slow=1.0)
    spec = "dropcompute:threshold=0.05,stop=between"
    append_machine(tmp_path, machine_row(0, 2) | {"cut": False, "remedy": {
        "spec": spec, "micro_batches": 2}})  # fmt: skip
    found = advise(tmp_path, setup="ddp", samples=400)
    assert (found.job.micro_batches, found.job.remedy) == (2, spec)
    assert found.notes[0].startswith(f"run 0 ran under {spec} at M=2")
    assert not any(r.row.strategy == "rebalance" for r in found.ranked)
    assert any("its cut, not shares" in n for n in found.notes)
    assert not any("already deals shares" in n for n in found.notes)
    assert found.choice.row.strategy == "dropcompute"  # priced again over the cut run
    assert "dropcompute is in force in run 0, at M=2" in found.reason
    plain = tmp_path / "plain"
    plain.mkdir()
    found = advise(probe_trace(plain / "trace.csv", runs=((32, 16),), slow=1.0), setup="ddp")
    assert found.job.remedy is None and any("already deals shares" in n for n in found.notes)


def accumulation_trace(path, steps=400):
    """A DDP loop accumulating 4 micro-batches under ``no_sync``, each timed as a step (the
    probe's loader wrapping before it knew ``no_sync``): rank 0 computes 1 ms a micro-batch,
    rank 1 10 ms; they meet only at each 4th, where rank 0 waits 36.5 ms and rank 1 0.5 ms.
    Every 4 steps take 40.5 ms on both ranks, for 4 x 64 samples, after a warm-up of
    ``WARMUP_STEPS`` steps of 1 s."""
    rows = []
    for i in range(WARMUP_STEPS):
        rows += [[i, 0, 1.0, 0.0, 32, 0], [i, 1, 1.0, 0.0, 32, 0]]
    for i in range(WARMUP_STEPS, WARMUP_STEPS + steps):
        meets = (i - WARMUP_STEPS) % 4 == 3
        rows += [[i, 0, 0.001, 0.0365 if meets else 0.0, 32, 0]]
        rows += [[i, 1, 0.010, 0.0005 if meets else 0.0, 32, 0]]
    write_trace_rows(path, np.array(rows), False, noncompute=True, samples=True, run=True)
    return path


def test_the_measured_rate_counts_a_wait_once_where_ranks_meet_every_few_steps(tmp_path):
    """Each rank's steps tile its time, so the run's wall is a rank's sum: 4 x 64 samples in
    40.5 ms. The sum of each step's slowest rank (10, 10, 10, 37.5 ms) would read 3793
    samples/s for the job's 6321, and sync's replayed row (10.1 ms a step) would disagree.
    The warm-up is left out (``bench_loop`` measures without it, and advise's forecasts)."""
    trace = read_trace(accumulation_trace(tmp_path / "trace.csv"))
    rate, step, steps = measured_rate(trace)
    assert rate == pytest.approx(4 * 64 / 0.0405)
    assert step == pytest.approx(0.0405 / 4) and steps == 400


def test_an_accumulating_job_is_dealt_shares_of_one_loader_batch(tmp_path):
    """The probe's steps of a loop that accumulates 4 loader batches of 32 under ``no_sync``
    hold 128 samples a rank, and its machine row says ``accumulates: 4``: rebalance deals
    one loader batch (48 + 16 = 2 x 32), the line names that batch size, and the forecast
    counts 4 of them a step. Without the row the same trace reads as one batch of 128."""
    path = probe_trace(tmp_path / "trace.csv", runs=((128, 128),))
    plain = advise(path, setup="ddp", samples=400)
    assert sum(plain.choice.shares) == 256  # one batch of 128 a rank: 3 to 1, about
    append_machine(tmp_path, machine_row(0) | {"accumulates": 4})
    found = advise(path, setup="ddp", samples=400)
    assert found.job.accumulation == 4 and found.choice.shares == (48, 16)
    assert (
        "shares=[48, 16])  # after loader = DataLoader(..., batch_size=32)"
        in (found.adopt.lines()[1])
    )
    assert found.choice.effective_speedup == pytest.approx(plain.choice.effective_speedup, rel=0.05)
    drop = next(n for n in found.notes if n.startswith("dropcompute:"))
    assert "accumulates loader batches under no_sync" in drop and "nothing to cut" not in drop


def test_a_trace_without_noncompute_is_measured_by_each_step_s_slowest_rank(tmp_path):
    """Without the wait recorded a rank's rows do not tile its time: 2 ranks, the slow one
    alternating (0.1 s and 0.01 s), run at 1 / 0.1 steps a second synchronously."""
    rows = []
    for i in range(20):
        slow = 0.1 if i % 2 == 0 else 0.01
        rows += [[i, 0, slow], [i, 1, 0.11 - slow]]
    path = tmp_path / "trace.csv"
    write_trace_rows(path, np.array(rows), False)
    rate, step, steps = measured_rate(read_trace(path))
    assert rate == pytest.approx(10.0) and step == pytest.approx(0.1)
    assert steps == 20 - WARMUP_STEPS


def test_the_shares_a_job_deals_are_per_loader_batch_as_rebalance_prints_them():
    """A step of an accumulating job sums its batches' samples: a job dealing shares [13, 3]
    over 4 batches a step records [52, 12], and what advise says it keeps is [13, 3], the
    argument the user gave; equal batches or a DropCompute cut deal no shares."""
    shaped = JobShape(2, 1, np.array([52, 12]), accumulation=4)
    assert shaped.dealt == (13, 3)
    assert JobShape(2, 1, np.array([53, 11]), accumulation=4).dealt == (53, 11)  # per step
    assert JobShape(2, 1, np.array([32, 32]), accumulation=4).dealt is None
    cut = JobShape(2, 4, np.array([32, 20]), remedy="dropcompute:threshold=0.1")
    assert cut.cut and cut.dealt is None
