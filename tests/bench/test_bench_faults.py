"""bench/bench_faults.py with its measures (bench/faults_measure.py) and goals
(bench/faults_goals.py): the measures and goals on made-up commits and rows (fast), and one
quick real run (slow: real processes, about a minute on a loaded 2-core machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import bench_faults as bf
from bench import faults_goals as fg
from bench import faults_measure as fm

ROOT = Path(__file__).resolve().parents[2]
CFG = SimpleNamespace(workers=2, batch=32, target_loss=1.0, micro_batches=1)


def commit(worker: int, pid: int, step: int, t: float) -> dict:
    return {"worker": worker, "pid": pid, "step": step, "t": t}


def history(steps: range, loss: float = 2.0, contributors: int = 2) -> dict:
    return {s: {"loss": loss, "contributors": contributors} for s in steps}


def test_a_restart_from_a_checkpoint_counts_its_replayed_steps(tmp_path):
    # both workers commit 0..4 at t = 1..5; worker 1 is killed at t = 5.5 starting step 5;
    # the group restarts (new pids) from the checkpoint of step 3: 3 and 4 again, then 5
    before = [commit(w, 10 + w, s, 1.0 + s) for w in (0, 1) for s in range(5)]
    after = [commit(w, 20 + w, s, 6.0 + s) for w in (0, 1) for s in range(3, 8)]
    fault = {"kind": "kill", "worker": 1, "step": 5, "t": 5.5}
    got = fm.measure(before + after, history(range(8)), fault, 0.0, 0, CFG, tmp_path, "x", {})
    assert got["fault_to_next_step"] == pytest.approx(11.0 - 5.5)  # step 5, not the replays
    assert got["restart_seconds"] == pytest.approx(9.0 - 5.5)
    assert got["steps_replayed"] == 2
    assert got["samples_replayed"] == 2 * 2 * 32
    assert got["heal_from"] == "checkpoint"
    assert got["samples_absent"] == 0


def test_a_replica_that_heals_from_a_peer_joins_at_the_head(tmp_path):
    # worker 0 goes on alone after worker 1's kill at t = 5.5; worker 1's new process
    # commits step 9 first, when worker 0 has committed up to 9 too
    w0 = [commit(0, 10, s, 1.0 + s) for s in range(12)]
    w1 = [commit(1, 11, s, 1.0 + s) for s in range(5)] + [commit(1, 21, 9, 10.5)]
    hist = {**history(range(5)), **history(range(5, 12), contributors=1)}
    hist[9] = {"loss": 2.0, "contributors": 2}
    fault = {"kind": "heal", "worker": 1, "step": 5, "t": 5.5}
    got = fm.measure(w0 + w1, hist, fault, 0.0, 0, CFG, tmp_path, "x", {})
    assert got["fault_to_next_step"] == pytest.approx(6.0 - 5.5)
    assert got["heal_seconds"] == pytest.approx(10.5 - 5.5)
    assert got["heal_from"] == "peer"
    assert got["healed_behind"] == 0
    assert got["steps_replayed"] == 0
    assert got["samples_absent"] == 6 * 32  # steps 5-8 and 10-11 without worker 1


def test_time_to_target_reads_the_moving_mean_of_the_final_history(tmp_path):
    commits = [commit(0, 10, s, 1.0 + s) for s in range(30)]
    hist = {s: {"loss": 2.0 if s < 15 else 0.5, "contributors": 2} for s in range(30)}
    got = fm.measure(commits, hist, None, 0.0, 0, CFG, tmp_path, "x", {})
    # the mean of 10 steps reaches 1.0 once 7 of them are at 0.5: step 21, committed 21 s
    # after step 0's commit
    assert got["time_to_target"] == pytest.approx(21.0)
    assert got["final_loss"] == pytest.approx(0.5)


def test_tailtrain_stamps_become_commits_per_process():
    stamps = [
        {"worker": 0, "pid": 1, "step": 0, "t": 0.0},
        {"worker": 0, "pid": 1, "step": 1, "t": 1.0},
        {"worker": 0, "pid": 1, "step": 2, "t": 2.0},  # killed in 2
        {"worker": 0, "pid": 2, "step": 1, "t": 9.0},  # restarted from the checkpoint of 1
        {"worker": 0, "pid": 2, "step": 2, "t": 10.0},
    ]
    got = sorted((c["pid"], c["step"], c["t"]) for c in fm.commits_from_starts(stamps))
    assert got == [(1, 0, 1.0), (1, 1, 2.0), (2, 1, 10.0)]


def test_goals_are_null_with_a_reason_without_the_shrink_rows():
    rows = {
        "tailtrain-shrink-sync": {"unavailable": "not available in this tree"},
        "tailtrain-shrink-eager": {"refused": "tailtrain train: error: shrink is for allreduce"},
    }
    goals = fg.goals(rows, CFG)
    assert set(goals) == set(fg.GOAL_NAMES)
    assert all(g["holds"] is None for g in goals.values())
    assert all("not available in this tree" in g["why"] for g in goals.values())
    assert all("shrink is for allreduce" in g["why"] for g in goals.values())


def test_a_shrunk_step_counts_its_dead_shard_and_a_gap_is_lost(tmp_path):
    # worker 1 dies in step 2: steps 2-3 run with rank 0 only; the record counts the dead
    # shard's 32 samples in step 2 but not in step 3, and step 4 is missing from it
    commits = [commit(0, 10, s, 1.0 + s) for s in range(6)] + [
        commit(1, 11, s, 1.0 + s) for s in range(2)
    ]
    hist = history(range(2))
    hist[2] = {"loss": 2.0, "contributors": 1, "absent": 1, "per_rank": 32, "counted": 32}
    hist[3] = {"loss": 2.0, "contributors": 1, "absent": 1, "per_rank": 32, "counted": 0}
    hist[5] = {"loss": 2.0, "contributors": 1, "absent": 1, "per_rank": 32, "counted": 32}
    got = fm.accounting(commits, hist, CFG)
    assert got["samples_absent"] == 3 * 32 and got["samples_counted_skipped"] == 2 * 32
    assert got["steps_lost"] == 1
    assert got["samples_lost"] == 32 + 2 * 32  # step 3's uncounted shard + step 4's two
    assert got["samples_replayed"] == 0


def test_a_rule_dropping_a_contributor_is_no_fault_absence():
    # a shrinking run's row: all four ranks live, the rule used three (eager's late one)
    row = {"step": 7, "loss": 1.0, "workers": [0, 1, 2], "live": [0, 1, 2, 3], "skipped": 0}
    cfg = SimpleNamespace(workers=4, batch=32)
    got = bf.tailtrain_step(row | {"micro_batches": 2}, cfg)
    assert got["absent"] == 0 and got["contributors"] == 3 and got["per_rank"] == 64
    assert bf.tailtrain_step({**row, "live": [0, 2, 3]}, cfg)["absent"] == 1


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_quick_run_measures_a_stopped_rank_in_both_tailtrain_paths():
    argv = [sys.executable, str(ROOT / "bench" / "bench_faults.py"), "--quick", "--json"]
    argv += ["--rows", "tailtrain-before,tailtrain-shrink-sync", "--drills", "stop"]
    argv += ["--steps", "24", "--hold", "1", "--run-timeout", "240"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    stop = report["rows"]["tailtrain-before"]["stop"]
    assert stop["fault"]["kind"] == "stop"
    assert stop["fault_to_next_step"] > 0
    assert stop["steps"] == 24 and stop["steps_replayed"] == 0
    shrink = report["rows"]["tailtrain-shrink-sync"]["stop"]
    assert shrink["fault"]["kind"] == "stop" and shrink["fault_to_next_step"] > 0
    assert shrink["samples_lost"] == 0 and shrink["samples_replayed"] == 0
    assert report["shrink_rows"]["tailtrain-shrink-eager"] == "not selected (--rows)"
    assert set(fg.GOAL_NAMES) <= set(report["goals"])
    assert len(report["load_average_before"]) == 3 and report["wall_s"] > 0


def made_up_rows() -> dict:
    def row(next_step: float, heal: float, target: float, **more) -> dict:
        cells = {}
        for d in ("none", "kill", "stop", "freeze", "heal"):
            cells[d] = {"fault_to_next_step": next_step, "heal_seconds": heal}
            cells[d] |= {"samples_replayed": 0, "samples_lost": 0, "steps_lost": 0}
            cells[d] |= {"time_to_target": target, "target_step": 100}
            cells[d] |= {"absence_steps_to_target": 0.0 if d == "none" else 5.0, **more}
        cells["heal"]["heal_from"] = "peer"
        return cells

    return {
        "tailtrain-shrink-sync": row(0.4, 3.0, 19.0, hang_deadline_s=2.5),
        "tailtrain-shrink-dropcompute": row(0.5, 2.0, 10.0),
        "tailtrain-shrink-eager": {"refused": "tailtrain train: error: no partial shrink"},
        "torchft-default": row(5.0, 16.0, 20.0),
        "torchft-tuned": row(2.0, 17.0, 18.0),
        "tailtrain-before": row(16.0, 0.0, 20.0),
    }


def test_goals_compare_the_shrink_rows_with_torchft_and_the_restart_path():
    rows = made_up_rows()
    goals = fg.goals(rows, CFG)
    assert goals["kill_next_step_no_later_than_torchft"]["holds"] is True
    assert goals["stop_next_step_5x_sooner_than_restart"]["holds"] is True  # 0.5 * 5 <= 16
    assert goals["freeze_sooner_than_torchft_default_and_tuned"]["holds"] is True
    # sync's deadline 2.5 s + 1 >= 0.4; dropcompute's summary has none: no verdict for it
    freeze = goals["freeze_within_deadline_plus_1s"]
    assert freeze["holds"] is True
    assert freeze["by_row"]["tailtrain-shrink-dropcompute"]["holds"] is None
    assert "summary.json's hang_deadline" in freeze["by_row"]["tailtrain-shrink-dropcompute"]["why"]
    assert goals["heal_no_slower_than_torchft"]["holds"] is True
    assert goals["no_sample_lost_or_done_twice"]["holds"] is True
    # sync 19/18 > 0.67 but dropcompute 10/18 <= 0.67: one straggler-tolerant row is enough
    target = goals["time_to_target_at_most_0.67x_torchft"]
    assert target["holds"] is True
    assert target["by_row"]["tailtrain-shrink-sync"]["holds"] is False
    # calm 10 s at step 100: 0.1 s a step; 5 absent whole-world steps allow 11 + 0.5 s
    calm = goals["time_to_target_within_10pct_of_calm_plus_absence"]
    assert calm["by_row"]["tailtrain-shrink-dropcompute"]["limit"]["kill"] == pytest.approx(11.5)
    assert calm["holds"] is True
    assert goals["time_to_target_goals_same_row"]["rows"] == ["tailtrain-shrink-dropcompute"]


def test_a_goal_fails_on_one_row_or_a_missing_figure():
    rows = made_up_rows()
    rows["tailtrain-shrink-dropcompute"]["kill"]["fault_to_next_step"] = 2.5
    assert fg.goals(rows, CFG)["kill_next_step_no_later_than_torchft"]["holds"] is False
    rows["tailtrain-shrink-sync"]["stop"]["fault_to_next_step"] = None  # no next step came
    assert fg.goals(rows, CFG)["stop_next_step_no_later_than_torchft"]["holds"] is False
    rows["tailtrain-shrink-sync"]["heal"]["heal_from"] = "checkpoint"
    assert fg.goals(rows, CFG)["heal_no_slower_than_torchft"]["holds"] is False
    rows["tailtrain-shrink-dropcompute"]["freeze"]["samples_lost"] = 32
    assert fg.goals(rows, CFG)["no_sample_lost_or_done_twice"]["holds"] is False
    rows["tailtrain-shrink-dropcompute"]["stop"]["time_to_target"] = 11.6  # over 11.5
    calm = fg.goals(rows, CFG)["time_to_target_within_10pct_of_calm_plus_absence"]
    assert calm["by_row"]["tailtrain-shrink-dropcompute"]["holds"] is False
    del rows["torchft-default"]
    freeze = fg.goals(rows, CFG)["freeze_sooner_than_torchft_default_and_tuned"]
    assert freeze["holds"] is None and "torchft-default" in freeze["why"]


def test_the_logged_deadline_is_read_beside_the_goal_not_scored(tmp_path):
    log = tmp_path / "train.out"
    log.write_text(
        "WARNING rank 0 tailtrain.runtime: step 64: all_reduce failed, a peer may have died: "
        "generation 0: no answer within the deadline 2.68s\n"
    )
    assert bf.logged_deadlines(log) == [2.68]
    assert bf.logged_deadlines(tmp_path / "absent.out") is None
    rows = made_up_rows()
    del rows["tailtrain-shrink-sync"]["freeze"]["hang_deadline_s"]
    rows["tailtrain-shrink-sync"]["freeze"]["deadlines_logged_s"] = [2.68]
    cell = fg.goals(rows, CFG)["freeze_within_deadline_plus_1s"]["by_row"]["tailtrain-shrink-sync"]
    assert cell["holds"] is None and cell["deadlines_logged_s"] == [2.68]


def test_the_rebalance_rows_are_shrink_rows_that_need_micro_batches():
    assert set(bf.SHARES_ROWS) <= set(fg.SHRINK) <= set(bf.ROWS)
    assert fg.SHRINK["tailtrain-shrink-rebalance"] == "rebalance"
    assert fg.SHRINK["tailtrain-shrink-rebalance-dropcompute"] == "rebalance:then=dropcompute"
    cfg = SimpleNamespace(workers=4, micro_batches=1)
    wrong = bf.bad_arguments(["tailtrain-shrink-rebalance", "torchft-tuned"], ["none"], cfg)
    assert "tailtrain-shrink-rebalance" in wrong and "--micro-batches 2" in wrong
    assert bf.bad_arguments(["tailtrain-shrink-sync", "ddp"], ["kill"], cfg) is None
    assert (
        bf.bad_arguments(
            list(bf.ROWS), list(bf.DRILLS), SimpleNamespace(workers=4, micro_batches=8)
        )
        is None
    )
    assert "--micro-batches 0" in bf.bad_arguments(
        ["ddp"], ["none"], SimpleNamespace(workers=4, micro_batches=0)
    )
    assert "--workers 9" in bf.bad_arguments(
        ["ddp"], ["none"], SimpleNamespace(workers=9, micro_batches=8)
    )
    assert "['nope']" in bf.bad_arguments(["nope"], ["none"], cfg)


def test_the_default_delay_sleeps_the_same_step_whatever_the_micro_batches():
    assert bf.default_delay(1) == "shifted-exp:shift=0.08,scale=0.02"
    assert bf.default_delay(8) == "shifted-exp:shift=0.01,scale=0.0025"


def test_a_threshold_cut_is_dropped_by_the_rule_not_lost():
    cfg = SimpleNamespace(workers=4, batch=32)
    # rebalance:then=dropcompute: shares dealt 9+8+6+9, completed 7+7+5+7: 6 micro-batches cut
    shares = {"step": 3, "loss": 1.0, "workers": [0, 1, 2, 3], "micro_batches": 8}
    shares |= {"shares": [9, 8, 6, 9], "completed": [7, 7, 5, 7], "live": [0, 1, 2, 3]}
    # dropcompute after worker 3's loss: three live ranks of 8 micro-batches, 3 cut
    cut = {"step": 4, "loss": 1.0, "workers": [0, 1, 2], "micro_batches": 8}
    cut |= {"completed": [8, 8, 5], "live": [0, 1, 2], "skipped": 8 * 32}
    hist = {3: bf.tailtrain_step(shares, cfg), 4: bf.tailtrain_step(cut, cfg)}
    assert hist[3]["dropped"] == 6 * 32 and hist[4]["dropped"] == 3 * 32
    assert bf.tailtrain_step({"step": 0, "loss": 1.0, "workers": [0]}, cfg)["dropped"] == 0
    commits = [commit(w, 10 + w, s, 1.0 + s) for w in range(3) for s in (3, 4)]
    got = fm.accounting(commits, hist | {s: dict(hist[3]) for s in range(3)}, cfg)
    assert got["samples_dropped_by_rule"] == 4 * 6 * 32 + 3 * 32
    assert got["samples_absent"] == 8 * 32 == got["samples_counted_skipped"]
    assert got["samples_lost"] == 0


def test_a_rebalance_row_alone_can_meet_the_time_to_target_goals():
    rows = made_up_rows()
    rows["tailtrain-shrink-dropcompute"] = {"refused": "not selected"}
    rows["tailtrain-shrink-rebalance-dropcompute"] = made_up_rows()["tailtrain-shrink-dropcompute"]
    goals = fg.goals(rows, CFG)
    target = goals["time_to_target_at_most_0.67x_torchft"]
    assert target["holds"] is True
    assert target["by_row"]["tailtrain-shrink-rebalance-dropcompute"]["ratios"][
        "none"
    ] == pytest.approx(10 / 18, abs=1e-3)
    assert goals["time_to_target_goals_same_row"]["rows"] == [
        "tailtrain-shrink-rebalance-dropcompute"
    ]
    # the better torchft row on each drill: tuned's 18 s, unless default's is smaller there
    rows["torchft-default"]["kill"]["time_to_target"] = 14.0
    cell = fg.goals(rows, CFG)["time_to_target_at_most_0.67x_torchft"]
    assert cell["by_row"]["tailtrain-shrink-rebalance-dropcompute"]["torchft_best"]["kill"] == 14.0
    assert cell["holds"] is False  # 10 / 14 > 0.67


def test_a_peer_draws_and_computes_the_m_micro_batches_of_a_tailtrain_step():
    import torch
    import torch.nn.functional as F

    from bench import faults_peer as fp
    from tailtrain.runtime.inject import Injector

    args = SimpleNamespace(task="digits-cnn", workers=4, steps=5, seed=0, micro_batches=3)
    args.delay, args.pattern = bf.default_delay(3), "slowdown:at=0,fraction=0.25,factor=1.5"
    # the rank's M draws of each step, as tailtrain's sync draws them (each from
    # its own world: the draws are the world's delay process's, read in order)
    world = fp.build(args)
    noise = fp.Noise(world, 2)
    injector = Injector(fp.build(args), 2, delays=True)
    for step in range(2):
        assert noise.seconds(step) == pytest.approx(injector.unit_times(1, 3, 0.0).tolist())
    # M forward and backward passes, allreduced on the last: the mean gradient of all 3 x 32

    class Wrapped(torch.nn.Module):  # DDP's no_sync, without a process group
        def __init__(self, module):
            super().__init__()
            self.module, self.syncs = module, []

        def forward(self, x):
            return self.module(x)

        def no_sync(self):
            import contextlib

            self.syncs.append(False)
            return contextlib.nullcontext()

    model = world.task.module_at(world.task.init_params(0))
    wrapped = Wrapped(model)
    loss = fp.accumulate(wrapped, world, 1, 4, 0, 3)
    assert wrapped.syncs == [False, False]
    got = [p.grad.clone() for p in model.parameters()]
    batches = [fp.batch(world, 1, 4, 0, micro) for micro in range(3)]
    model.zero_grad()
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    whole = F.cross_entropy(model(x), y)
    whole.backward()
    assert loss == pytest.approx(float(whole.detach()), rel=1e-5)
    for g, p in zip(got, model.parameters(), strict=True):
        assert torch.allclose(g, p.grad, atol=1e-6)


def test_a_peer_sleeps_its_draws_between_its_micro_batches_as_a_tailtrain_rank(monkeypatch):
    # draw u after micro-batch u, the last one before the micro-batch whose backward
    # starts the allreduce: the straggler's compute shares the CPU as a tailtrain rank's does
    import torch

    from bench import faults_peer as fp

    args = SimpleNamespace(task="digits-cnn", workers=4, steps=5, seed=0, micro_batches=3)
    args.delay, args.pattern = bf.default_delay(3), "iid"
    world = fp.build(args)
    events = []
    monkeypatch.setattr(fp.time, "sleep", lambda s: events.append(("sleep", s)))

    class Logged(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            events.append(("micro", None))
            return self.module(x)

        def no_sync(self):
            import contextlib

            return contextlib.nullcontext()

    model = Logged(world.task.module_at(world.task.init_params(0)))
    # torchft's quorum starts before the last draw's sleep: a SIGSTOP in the step's first
    # sleeps lands before the replica joins it
    fp.accumulate(model, world, 1, 4, 0, 3, [0.1, 0.2, 0.3], lambda: events.append("quorum"))
    assert events == [
        ("micro", None),
        ("sleep", 0.1),
        ("micro", None),
        ("sleep", 0.2),
        "quorum",
        ("sleep", 0.3),
        ("micro", None),
    ]


def test_a_peer_step_counts_its_m_micro_batches(tmp_path):
    # a peer's history has no per-step count: each rank's step is M micro-batches of 32
    cfg = SimpleNamespace(workers=2, batch=32, target_loss=1.0, micro_batches=8)
    before = [commit(w, 10 + w, s, 1.0 + s) for w in (0, 1) for s in range(4)]
    again = [commit(w, 20 + w, s, 6.0 + s) for w in (0, 1) for s in (3, 5)]
    got = fm.accounting(before + again, history(range(4)) | history(range(5, 6)), cfg)
    assert got["samples_replayed"] == 2 * 8 * 32  # step 3 again on both ranks
    assert got["steps_lost"] == 1 and got["samples_lost"] == 2 * 8 * 32  # step 4
