"""bench/bench_loop.py: its injected law, its measures and bounds on made-up logs (fast), and
one ``--quick`` run of the loop end to end (slow: real processes, two advise calls)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bench.loop_job.inject import Injector

from bench import bench_loop as bl

ROOT = Path(__file__).resolve().parents[2]


def test_the_delay_is_proportional_to_the_work_however_the_batch_is_cut():
    # (a)'s law: the same sleep for a batch of 32 and for its two halves, 3x on the slow rank
    slow = Injector({"d": 1e-3, "factors": [1.0, 3.0], "chunk": 8}, rank=1)
    assert slow.delay(32) == pytest.approx(3 * 32e-3)
    assert slow.delay(16) + slow.delay(16) == pytest.approx(slow.delay(32))
    assert slow.delay(3) == pytest.approx(3 * 3e-3)  # a partial chunk pays per sample


def test_the_noise_is_one_stream_per_rank_drawn_per_chunk():
    law = {"d": 1e-3, "factors": [1.0, 1.0], "chunk": 8, "noise": bl.NOISE, "seed": 5}
    whole, quarters, eighths = (Injector(law, rank=0) for _ in range(3))
    # 32 samples at once, in 4 micro-batches of 8 or in 8 of 4 meet the same four draws
    once = whole.delay(32)
    assert once == pytest.approx(sum(quarters.delay(8) for _ in range(4)))
    assert once == pytest.approx(sum(eighths.delay(4) for _ in range(8)))
    assert once != pytest.approx(Injector(law, rank=1).delay(32))  # a stream per rank
    # the draws are DropCompute's bounded noise: at least the base, at most (1 + 5.5) of it
    draws = [whole.delay(8) for _ in range(200)]
    assert min(draws) >= 8e-3 and max(draws) <= 6.5 * 8e-3
    assert np.mean(draws) > 8e-3 * 1.3  # E e is about 0.5


def rows(ts, samples, losses):
    return [{"t": t, "samples": s, "loss": v} for t, s, v in zip(ts, samples, losses, strict=True)]


def test_samples_per_second_leave_out_the_warm_up_and_sum_the_ranks():
    ts = [10.0, 11.0] + [11.0 + 0.5 * k for k in range(1, 21)]  # a slow first step
    r0 = rows(ts, [32] * 22, [2.0] * 22)
    r1 = rows(ts, [16] * 22, [2.0] * 22)
    got = bl.measure([r0, r1], target=1.0)
    assert got["samples_per_second"] == pytest.approx(20 * 48 / 10.0)
    assert got["seconds_per_step"] == pytest.approx(0.5)
    assert got["samples_per_rank_per_step"] == [32, 16]
    assert got["time_to_target"] is None


def test_time_to_target_reads_rank_0s_moving_mean():
    ts = [float(k) for k in range(40)]
    losses = [2.0] * 20 + [0.5] * 20
    got = bl.measure([rows(ts, [8] * 40, losses)], target=1.0)
    # the mean of 10 steps is at most 1.0 once 7 of them are at 0.5: step 26, 26 s after step 0
    assert got["step_at_target"] == 26
    assert got["time_to_target"] == pytest.approx(26.0)


def test_the_bounds_of_shares_by_speed():
    a = bl.shares_bound(3.0, 2)
    assert a["fluid"] == pytest.approx(2.0)
    assert a["integer_shares"] == [48, 16] and a["integer"] == pytest.approx(2.0)
    b = bl.shares_bound(25.0, 2)
    assert b["fluid"] == pytest.approx(13.0)
    assert sum(b["integer_shares"]) == 64 and b["integer"] <= b["fluid"]
    assert bl.shares_bound(3.0, 4)["fluid"] == pytest.approx(2.5)


def test_goals_without_an_after_half_are_unknown_not_false():
    case = {
        "pairs": [{"before": {"verdicts": {1: "persistent"}}}],
        "advice": {"recommendation": "sync"},
        "figures": {},
    }
    got = bl.goals({"a-2": case, "d-2": case}, {"a-2": {}, "d-2": {}})
    assert got["a-2"]["holds"] is None and got["a-2"]["verdict_unchanged"] is None
    assert got["d-2"]["holds"] is None and got["a-2"]["forecast_within_10pct"] is None


def test_advise_numbers_are_read_where_they_are():
    advice = {
        "recommendation": "rebalance",
        "results": [
            {"spec": "sync", "samples_applied_per_second": 600.0, "samples_applied_ratio": 1.0},
            {
                "spec": "rebalance",
                "samples_applied_per_second": 1200.0,
                "samples_applied_ratio": 2.0,
            },
        ],
        "before_after": {"last_over": {"0": 1.9}},
    }
    assert bl.forecast(advice)["per_second"] == 1200.0 and bl.forecast(advice)["ratio"] == 2.0
    assert bl.forecast({"recommendation": "sync"})["per_second"] is None
    assert bl.achieved(advice) == 1.9 and bl.achieved({"before_after": None}) is None


@pytest.mark.slow  # 35-75 s on the shared 2-core machine: start-ups of torch and advise
@pytest.mark.timeout(300)
def test_quick_runs_the_loop_and_reports_goals(tmp_path):
    done = subprocess.run(
        [sys.executable, "bench/bench_loop.py", "--quick", "--json", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=290,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    case = report["cases"]["a-2"]
    assert "after_unavailable" not in case, case["after_unavailable"]
    pair = case["pairs"][0]
    before, after = pair["before"], pair["after"]
    first, second = before["samples_per_rank_per_step"]
    assert first == second  # the tutorial's equal batches
    assert before["verdicts"].get("1") == "persistent"  # the injected straggler, named
    # advise's printed change, applied: rank 1 computes fewer samples of the same global batch
    fast, slow = after["samples_per_rank_per_step"]
    assert slow < fast and after["samples_per_step"] == pytest.approx(
        before["samples_per_step"], rel=0.05
    )
    assert report["bounds"]["a-2"]["fluid"] == pytest.approx(2.0)
    goal = report["goals"]["a-2"]
    assert goal["samples_per_second_ratio"] > 0 and isinstance(goal["verdict_unchanged"], bool)
    assert len(report["machine"]["load_start"]) == 3


# The job is the DDP tutorial's shape; what the after half needs from the package


def probed_job() -> str:
    from tailtrain.advice.patch import apply_edits

    return apply_edits(bl.JOB.read_text(), bl.PROBE_EDITS)


def test_the_probe_pasted_into_a_trainer_lives_beside_its_ddp_model():
    job = probed_job()
    assert 'self.probe = StragglerProbe("@PROBE_DIR@").watch(self.model)' in job
    assert "for source, targets in self.probe.batches(self.train_data):" in job


def test_rebalance_edits_apply_to_the_tutorial_job():
    from tailtrain.advice.adopt import ddp_rebalance
    from tailtrain.advice.patch import apply_edits

    job = apply_edits(bl.JOB.read_text(), ddp_rebalance("rebalance", (48, 16)).edits())
    assert "self.train_data = rebalance_loader(self.train_data, shares=[48, 16])" in job
    assert "self.model.register_comm_hook(self.train_data.batch_sampler" in job


def test_the_probe_and_rebalance_edits_apply_to_the_accumulating_job():
    """``--accumulate``'s job: the probe wraps its loader, the shares deal it, and its no_sync
    accumulation stays as it is (the probe times a step per reduction)."""
    from tailtrain.advice.adopt import ddp_rebalance
    from tailtrain.advice.patch import apply_edits

    probed = apply_edits(bl.ACCUMULATE_JOB.read_text(), bl.PROBE_EDITS)
    job = apply_edits(probed, ddp_rebalance("rebalance", (48, 16)).edits())
    assert "for x, y in probe.batches(loader):" in job
    assert "loader = rebalance_loader(loader, shares=[48, 16])" in job
    assert "ddp.register_comm_hook(loader.batch_sampler, sample_weighted_hook)" in job
    assert "with nullcontext() if last else ddp.no_sync():" in job


def test_dropcompute_edits_apply_to_the_probed_tutorial_job():
    from tailtrain.advice.adopt import ddp_dropcompute
    from tailtrain.advice.patch import apply_edits

    job = apply_edits(probed_job(), ddp_dropcompute("dropcompute:threshold=0.05", 4).edits())
    assert "self.state.micro_batches(self.model" in job


def test_a_rebalanced_loader_keeps_the_tutorials_set_epoch():
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from tailtrain import rebalance_loader

    data = TensorDataset(torch.arange(128.0))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, 2, 0, seed=0))
    rebalanced = rebalance_loader(loader, shares=[48, 16])
    rebalanced.sampler.set_epoch(1)  # the tutorial's self.train_data.sampler.set_epoch(epoch)
    assert loader.sampler.epoch == 1
