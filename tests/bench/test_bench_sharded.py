"""bench/bench_sharded.py: its law, its measures and bounds on made-up rows (fast, no
processes), and one short torchrun of its job: plain HSDP, ``ShardedStep`` checked against the
single-process reference the job builds from the records, and HSDP under the probe (slow)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from bench.bench_loop import env, free_port
from bench.sharded_job.job import GROUPS, Law, M

from bench import bench_sharded as bs


def test_the_law_sleeps_one_draw_per_micro_batch_alike_on_a_group_s_ranks(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("bench.sharded_job.job.time.sleep", slept.append)
    for _shard in range(2):  # both ranks of group 1 build the law from (seed, group)
        law = Law(0.01, 1.5, group=1, seed=4, noisy=True)
        for _ in range(50):
            law.sleep()
    first, second = slept[:50], slept[50:]
    assert first == second and min(first) >= 0.01 * 8 * 1.5
    assert np.mean(first) > 1.3 * 0.01 * 8 * 1.5  # the noise's mean is about 0.5
    quiet: list[float] = []
    monkeypatch.setattr("bench.sharded_job.job.time.sleep", quiet.append)
    Law(0.01, 1.0, group=0, seed=4, noisy=False).sleep()
    assert quiet == [pytest.approx(0.08)]


def test_a_run_s_table_leaves_out_the_warm_up():
    ends = [0.0] + [10.0 + k for k in range(bs.WARMUP + 5)]
    row = {"ends": ends, "samples": [320] * len(ends)}
    table = bs.table(row)
    assert table["seconds"] == pytest.approx([1.0] * (len(ends) - bs.WARMUP))
    assert bs.per_second(table) == pytest.approx(320.0)


def test_a_rule_s_steady_state_starts_after_its_last_move_of_the_shares():
    shares = [[5, 5]] * 30 + [[6, 4]] * 3 + [[7, 3]] * 20
    row = {"ends": [float(k) for k in range(53)], "samples": [80] * 53, "shares": shares}
    assert bs.settled(row) == 33 and len(bs.table(row)["seconds"]) == 20
    assert bs.settled({"ends": [], "samples": [], "shares": [[5, 5]] * 40}) == bs.WARMUP
    with pytest.raises(RuntimeError, match="steady steps"):
        bs.table({**row, "shares": shares[:-2] + [[8, 2]] * 2, "variant": "step0"})


def test_a_drill_s_truth_is_its_group_s_ranks_one_rank_or_none():
    assert bs.truth_of("group1") == [2, 3] and bs.truth_of("group0") == [0, 1]
    assert bs.truth_of("rank2") == [2] and bs.truth_of("none") == []


def test_the_bounds_order_the_remedies_and_an_overhead_narrows_them():
    slow = bs.bounds([1.0, 1.5], hsdp_step=None)
    # the fluid bound is 1.25 without noise; the noise lifts it, integer shares stay below it
    assert 1.2 < slow["every_rank_busy_over_sync"] < 1.3
    assert slow["best_shares"] == [12, 8] and 1.1 < slow["best_shares_over_sync"] < 1.2
    sync_seconds = 1.0  # far above the law's own (about 0.9 s): an overhead per micro-batch
    loaded = bs.bounds([1.0, 1.5], hsdp_step=sync_seconds)
    assert loaded["overhead_per_micro_batch_s"] > 0
    assert 1.0 < loaded["best_shares_over_sync_with_overhead"] < slow["best_shares_over_sync"]
    even = bs.bounds([1.0, 1.0])
    assert even["best_shares"] == [M, M] and even["best_shares_over_sync"] == pytest.approx(1.0)
    # dealt on demand: below every rank always busy, the pool alone (no cut) below instant cuts,
    # and above integer shares under both laws (list scheduling evens the noise out too)
    for law in (slow, even):
        cut, alone = law["demand_cut_at_once_over_sync"], law["demand_pool_alone_over_sync"]
        assert law["best_shares_over_sync"] < alone < cut < law["every_rank_busy_over_sync"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_job_runs_hsdp_and_sharded_step_and_agrees_with_its_reference(tmp_path):
    out = tmp_path / "runs.jsonl"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        str(bs.JOB), "--steps", "3", "--factors", "1,1.5",
        "--seconds-per-sample", "0.001",
        "--specs", json.dumps(["rebalance:warmup=1", "rebalance:deal=demand"]),
        "--order", "hsdp,step0,probe,step1", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    hsdp, step, probed, demand = (json.loads(line) for line in out.read_text().splitlines())
    assert hsdp["variant"] == "hsdp" and step["spec"] == "rebalance:warmup=1"
    assert hsdp["samples"] == [GROUPS * 2 * M * 8] * 3 == step["samples"]
    assert len(step["ends"]) == 3 and step["shares"][0] == [M, M]
    assert step["max_abs_diff"] < 1e-6  # float rounding: FSDP sums in another order
    assert probed["variant"] == "probe" and len(probed["ends"]) == 3  # too short to report
    assert probed["named"] == [[]] and probed["groups"] == [[0, 1], [2, 3]]  # close's flush
    assert demand["spec"] == "rebalance:deal=demand" and demand["shares"] == [None] * 3
    assert [sum(c) for c in demand["completed"]] == [GROUPS * M] * 3  # the pool, counted
    assert demand["samples"] == step["samples"] and demand["max_abs_diff"] < 1e-6
