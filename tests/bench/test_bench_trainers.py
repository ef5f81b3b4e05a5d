"""bench/bench_trainers.py: its jobs' shared law and log, its measures, bootstrap bands, bound
and goals on made-up logs (fast, no processes), and one short torchrun of the Lightning
DropCompute job through the bench's own runner (slow)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bench.trainers_job.common import MICRO, TRAIN, Work, own_loader, steps_of

from bench import bench_trainers as bt


def rows(ts, samples, completed=None):
    completed = completed or [None] * len(ts)
    return [
        {"t": t, "samples": s, "completed": c}
        for t, s, c in zip(ts, samples, completed, strict=True)
    ]


def test_the_law_sleeps_per_sample_and_draws_noise_only_on_the_noisy_rank():
    law = bt.law(noisy=True, seed=3)
    quiet, noisy = Work(law, rank=0), Work(law, rank=1)
    assert quiet.injector.delay(MICRO) == pytest.approx(MICRO * bt.D)  # no draw on rank 0
    draws = [noisy.injector.delay(MICRO) for _ in range(200)]
    assert min(draws) >= MICRO * bt.D and np.mean(draws) > 1.3 * MICRO * bt.D
    assert Work(bt.law(noisy=False, seed=3), rank=1).injector.delay(MICRO) == pytest.approx(
        MICRO * bt.D
    )


def test_work_counts_the_samples_it_forwards_per_step():
    work = Work({"d": 0.0}, rank=0)
    net = torch.nn.Linear(64, 10)
    work(net, torch.zeros(8, 64))
    work(net, torch.zeros(8, 64))
    work.step_end(SimpleNamespace(completed=[2, 1], threshold=0.05))  # a StepRecord's fields
    work.step_end()
    assert [r["samples"] for r in work.rows] == [16, 0]
    assert work.rows[0]["completed"] == [2, 1] and work.rows[0]["threshold"] == 0.05
    assert work.rows[1]["completed"] is None


def test_the_own_loops_steps_are_m_micro_batches_over_epochs():
    loader, sampler = own_loader(2, 0)
    per_epoch = TRAIN // 2 // MICRO // bt.M
    got = list(steps_of(loader, sampler, per_epoch + 3))  # into the second epoch
    assert len(got) == per_epoch + 3
    assert all(len(g) == bt.M and all(len(x) == MICRO for x, _ in g) for g in got)
    assert sampler.epoch == 1


def test_the_step_table_leaves_out_the_warm_up_and_sums_the_ranks():
    ts = [0.0, 5.0] + [5.0 + 0.5 * k for k in range(1, 11)]  # a slow first step
    table = bt.step_table([rows(ts, [32] * 12), rows(ts, [16] * 12)], warmup=2)
    assert table["seconds"] == pytest.approx([0.5] * 10)
    assert table["samples"] == pytest.approx([48] * 10)
    assert bt.per_second(table) == pytest.approx(96.0)
    assert bt.median_step(table) == pytest.approx(0.5)
    with pytest.raises(RuntimeError, match="only 3"):
        bt.step_table([rows(ts[:3], [8] * 3)], warmup=2)


def test_the_count_check_compares_forwarded_samples_with_the_records():
    records = [[4, 2], [4, 3]]
    agreed = [rows([1.0, 2.0], [32, 32], records), rows([1.0, 2.0], [16, 24], records)]
    assert bt.count_checked(agreed) is True
    short = [rows([1.0], [32], [[4, 2]]), rows([1.0], [8], [[4, 2]])]  # 40 != 6 x 8
    assert bt.count_checked(short) is False
    assert bt.count_checked([rows([1.0], [32]), rows([1.0], [32])]) is None


def table(seconds, samples):
    return {"seconds": np.asarray(seconds, float), "samples": np.asarray(samples, float)}


def test_the_remedy_ratio_is_lightnings_speedup_over_the_own_loops():
    rng = np.random.default_rng(0)
    rounds = [
        {
            "lightning_ddp": table([0.2] * 20, [64] * 20),  # 320 / s
            "lightning_straggler": table([0.16] * 20, [56] * 20),  # 350 / s
            "ddp_loop": table([0.16] * 20, [64] * 20),  # 400 / s
            "step_loop": table([0.125] * 20, [55] * 20),  # 440 / s
        }
    ] * 2
    f = bt.remedy_figures(rounds, rng)
    assert f["lightning_speedup_median"] == pytest.approx(350 / 320)
    assert f["step_speedup_median"] == pytest.approx(1.1)
    assert f["ratio_median"] == pytest.approx((350 / 320) / 1.1)
    assert f["ratio_band"] == pytest.approx([(350 / 320) / 1.1] * 2)  # no spread to resample
    assert f["share_of_gain"][0] == pytest.approx((350 / 320 - 1) / 0.1)
    assert f["lightning_ddp_over_ddp_loop"] == pytest.approx([0.8, 0.8])
    assert f["a_a_ddp_loop"] == pytest.approx([1.0])
    goal = bt.goals({"remedy": {"figures": f, "runs": [{"count_checked": True}]}})
    got = goal["dropcompute_speedup_share"]
    assert got["met"] is True and got["value"] == pytest.approx(0.9943, abs=1e-4)
    assert "probe_overhead" not in goal


def test_the_overhead_ratio_and_its_band_come_from_the_runs_step_times():
    rng = np.random.default_rng(1)
    steps = np.random.default_rng(2).normal(0.1, 0.005, size=(3, 200))
    plain = [table(s, np.ones(200)) for s in steps]
    slower = [table(s * 1.02, np.ones(200)) for s in steps]
    f = bt.ratio_figures(slower, plain, bt.median_step, bt.boot_median, rng)
    assert f["ratios"] == pytest.approx([1.02] * 3) and f["median"] == pytest.approx(1.02)
    low, high = f["band"]
    assert low < 1.02 < high < 1.2  # resampled independently: a band around the ratio
    part = {"probe_over_plain": f, "a_a": bt.ratio_figures(plain, plain, bt.median_step,
                                                           bt.boot_median, rng)}  # fmt: skip
    goal = bt.goals({"overhead": part})["probe_overhead"]
    assert goal["met"] is False and goal["a_a"] == pytest.approx(1.0)
    assert goal["a_a_band"][0] < 1.0 < goal["a_a_band"][1]


def test_the_bound_orders_sync_the_best_threshold_and_every_rank_busy():
    got = bt.remedy_bound(draws=4000, seed=0)
    # one noisy rank of two: sync runs at the noisy rank's pace, E[e] ~ 0.5 per micro-batch
    assert got["every_rank_busy_over_sync"] == pytest.approx(1 + got["noise_mean"] / 2, rel=0.02)
    assert 1.0 < got["best_fixed_threshold_over_sync"] < got["every_rank_busy_over_sync"]
    unit = bt.D * bt.MICRO
    assert unit < got["best_threshold_seconds"] < bt.M * unit  # rank 0 cuts nothing past M
    # a threshold no step reaches is sync; tau at the best is the best
    far, best = bt.remedy_bound(4000, 0, [100.0, got["best_threshold_seconds"]])[
        "at_runs_thresholds"
    ]
    assert far["over_sync"] == pytest.approx(1.0)
    assert best["over_sync"] == pytest.approx(got["best_fixed_threshold_over_sync"])


def test_rotation_interleaves_the_order_of_runs():
    assert bt.rotated(["A", "B", "A'"], 1) == ["B", "A'", "A"]
    assert bt.rotated(["A", "B"], 2) == ["A", "B"]


@pytest.mark.slow  # one torchrun of two Lightning ranks: ~20 s of start-up on 2 shared cores
@pytest.mark.timeout(180)
def test_the_lightning_dropcompute_job_logs_what_its_records_count(tmp_path):
    pytest.importorskip("lightning")
    got = bt.run_job("lightning_straggler", tmp_path, 14, bt.law(noisy=True, seed=0))
    assert [len(r) for r in got] == [14, 14]
    # every forwarded micro-batch entered the update (the unit the bench counts is the
    # records'); calibration runs sync, and after it the threshold cuts the noisy rank 1
    assert bt.count_checked(got) is True
    assert all(row["completed"] == [bt.M, bt.M] for row in got[0][: bt.CALIBRATE])
    assert any(row["completed"][1] < bt.M for row in got[0][bt.CALIBRATE :])
    table = bt.step_table(got, bt.REMEDY_WARMUP)
    assert bt.per_second(table) > 0 and len(table["seconds"]) == 14 - bt.REMEDY_WARMUP
