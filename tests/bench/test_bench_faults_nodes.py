"""bench/bench_faults_nodes.py's pure parts, with its accounting
(bench/faults_nodes_accounting.py) and goals (bench/faults_nodes_goals.py), on made-up logs and
rows (fast; no process, no timing): its refusals, the accounting of a node's absence, the
global batch, the bound, a node's heal, and the goals scored from rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench import bench_faults_nodes as bn
from bench import faults_measure as fm
from bench import faults_nodes_accounting as na
from bench import faults_nodes_goals as ng
from bench import faults_nodes_setting as ns

CFG = SimpleNamespace(
    workers=6,
    batch=32,
    micro_batches=2,
    target_loss=1.0,
    delay="shifted-exp:shift=0.04,scale=0.01",
    slow_factor=1.5,
    compute_s=0.0,
    steps=60,
    seed=0,
)


# ---- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--rows", "tailtrain-sync,nope"], "unknown rows/drills ['nope']"),
        (["--drills", "freeze"], "unknown rows/drills ['freeze']"),
        (["--rows", "tailtrain-rebalance", "--micro-batches", "1"], "deals micro-batch shares"),
        (["--steps", "10"], "--steps 10: use 20 or more"),
        (["--slow-factor", "0.5"], "a slow node is 1 or more times slower"),
        (["--rows", ""], "need one name at least"),
        (["--repeats", "thaw=3"], "--repeats thaw=3: drills are kill, stop, slow, heal"),
        (["--repeats", "heal=0"], "each run once or more"),
        (["--repeats", "three"], "give N or drill=N"),
    ],
)
def test_a_bad_selection_is_refused_in_one_line_before_any_process(argv, says, capsys):
    with pytest.raises(SystemExit) as caught:
        bn.parse(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert says in err and err.strip().splitlines()[-1].count(says) == 1


def test_the_fault_strikes_a_node_other_than_the_first_in_the_run_s_middle():
    for seed in range(20):
        fault = bn.plan(SimpleNamespace(seed=seed, steps=100))
        assert fault["node"] in (1, 2)
        assert 30 <= fault["step"] <= 50
        assert fault["workers"] == [2 * fault["node"], 2 * fault["node"] + 1]


def test_a_node_is_its_launcher_s_whole_tree():
    # 10 the launcher; 11, 12 its workers (in sessions of their own); 13 a worker's child
    parent = {10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20}
    assert sorted(bn.tree(10, parent)) == [10, 11, 12, 13]
    assert bn.tree(21, parent) == [21]


def test_the_law_s_mean_is_the_shift_plus_the_scale():
    assert na.mean_delay("shifted-exp:shift=0.01,scale=0.0025") == pytest.approx(0.0125)


# ---- accounting --------------------------------------------------------------------------------
def tailtrain_row(worker, pid, step, t, live, loss=2.0):
    return {
        "worker": worker,
        "pid": pid,
        "step": step,
        "t0": t - 0.1,
        "t": t,
        "loss": loss,
        "committed": True,
        "part": True,
        "live": live,
        "completed": [CFG.micro_batches] * len(live),
    }


def test_a_tailtrain_record_counts_the_absent_node_and_its_smaller_global_batch():
    full, shrunk = list(range(6)), [0, 1, 2, 3]
    rows = [tailtrain_row(w, 100 + w, s, 1.0 + s, full) for w in range(6) for s in range(3)]
    rows += [tailtrain_row(w, 100 + w, s, 1.0 + s, shrunk) for w in range(4) for s in (3, 4)]
    commits, history = na.commits_and_history(rows, CFG)
    assert len(commits) == 18 + 8
    assert history[4]["absent"] == 2 and history[4]["contributors"] == 4
    assert history[4]["counted"] == 2 * CFG.micro_batches * CFG.batch  # the record says so
    assert history[0]["micro_batches"] == 12 and history[4]["micro_batches"] == 8
    batch = na.global_batch(history, {"step": 3})
    assert batch == {"before": 12, "after": 8, "after_min": 8}
    books = fm.accounting(commits, history, CFG)
    assert books["samples_absent"] == 2 * 2 * 2 * 32 and books["samples_lost"] == 0


def test_a_peer_s_contributors_are_the_workers_that_committed_and_count_nothing():
    rows = [
        {"worker": w, "pid": w, "step": s, "t0": s, "t": s + 0.5, "loss": 1.0 + w,
         "committed": True, "part": True}
        for w in range(6) for s in range(2)
    ]  # fmt: skip
    rows += [
        {"worker": w, "pid": w, "step": 2, "t0": 2, "t": 2.5, "loss": 1.0, "committed": True,
         "part": True}
        for w in range(4)
    ]  # fmt: skip
    rows.append({"worker": 5, "pid": 5, "step": 2, "t0": 2, "t": 2.5, "committed": True,
                 "part": False, "loss": 9.0})  # fmt: skip
    _, history = na.commits_and_history(rows, CFG)
    assert history[0]["loss"] == pytest.approx(3.5)
    assert history[2]["contributors"] == 4 and history[2]["micro_batches"] == 8
    assert "counted" not in history[2]


def test_the_bound_spreads_each_update_over_its_live_ranks_at_their_law_s_pace():
    history = {s: {"micro_batches": 12, "live": list(range(6))} for s in range(4)}
    cell = {"target_step": 3, "time_to_target": 1.0}
    mean = 0.05  # shift 0.04 + scale 0.01: 6 ranks at 20 micro-batches/s each
    got = na.bound_time(history, cell, CFG, None)
    assert got["bound_time_to_target"] == pytest.approx(3 * 12 * mean / 6, abs=1e-3)
    slow = na.bound_time(history, cell, CFG, {"workers": [4, 5]})
    rate = 4 / mean + 2 / (1.5 * mean)
    assert slow["bound_time_to_target"] == pytest.approx(3 * 12 / rate, abs=1e-3)
    assert na.bound_time(history, {"time_to_target": None}, CFG, None) == {
        "bound_time_to_target": None
    }


def test_each_rule_s_own_law_lies_between_the_bound_and_sync_s():
    """Under a constant law (no draw to average), sync waits for the slow node's M units,
    deal=demand's greedy pool ends at its last unit: with M = 4, the pool of 24 units takes
    0.04 s each on four ranks and 0.06 s on two; asks in time order reach the 24th at 0.16 s
    (6 at 0, 4 at 0.04, 2 at 0.06, 4 at 0.08, 6 at 0.12, 2 of 4 at 0.16), so the step ends
    at 0.20 s, against sync's 4 x 0.06 = 0.24 s and the bound's 24 / (4 / 0.04 + 2 / 0.06)
    = 0.18 s."""
    const = SimpleNamespace(**{**vars(CFG), "delay": "shifted-exp:shift=0.04,scale=0",
                               "micro_batches": 4})  # fmt: skip
    history = {s: {"micro_batches": 24, "live": list(range(6))} for s in range(4)}
    cell = {"target_step": 3, "time_to_target": 0.9}
    slow = {"workers": [4, 5]}
    sync = na.law_time("tailtrain-sync", history, cell, const, slow, draws=4)
    assert sync["law_time_to_target"] == pytest.approx(3 * 4 * 0.06)
    assert na.law_time("torchft-tuned", history, cell, const, slow, draws=4) == sync
    demand = na.law_time("tailtrain-deal-demand", history, cell, const, slow, draws=4)
    assert demand["law_time_to_target"] == pytest.approx(3 * 0.20)
    assert demand["time_to_target_over_law"] == 1.5
    bound = na.bound_time(history, cell, const, slow)["bound_time_to_target"]
    assert bound < demand["law_time_to_target"] < sync["law_time_to_target"]
    # a step whose live ranks computed less (sync after a shrink) is priced at its share
    history[3] = {"micro_batches": 16, "live": [0, 1, 2, 3]}
    shrunk = na.law_time("tailtrain-sync", history, cell, const, slow, draws=4)
    assert shrunk["law_time_to_target"] == pytest.approx(2 * 4 * 0.06 + 4 * 0.04)
    assert na.law_time("tailtrain-sync", history, {}, const, slow) == {"law_time_to_target": None}


def commit(worker, pid, step, t):
    return {"worker": worker, "pid": pid, "step": step, "t": t}


def test_a_node_whose_two_ranks_come_back_heals_from_a_peer():
    before = [commit(w, w, s, s) for w in range(6) for s in range(5)]
    after = [commit(w, w, s, s) for w in range(4) for s in range(5, 12)]
    back = [commit(w, 100 + w, s, s + 0.5) for w in (4, 5) for s in range(9, 12)]
    fired = {"t": 4.5}
    assert bn.heal_check(before + after + back, fired, [4, 5]) == {"heal_from": "peer"}
    everyone = [commit(w, 200 + w, s, s + 0.7) for w in range(4) for s in range(9, 12)]
    assert bn.heal_check(before + back + everyone, fired, [4, 5])["heal_from"] == "checkpoint"


def test_a_node_that_came_back_after_the_survivors_ended_did_not_heal():
    before = [commit(w, w, s, s) for w in range(6) for s in range(5)]
    after = [commit(w, w, s, s) for w in range(4) for s in range(5, 8)]
    alone = [commit(w, 100 + w, s, 20 + s) for w in (4, 5) for s in range(0, 8)]
    got = bn.heal_check(before + after + alone, {"t": 4.5}, [4, 5])
    assert got["heal_seconds"] is None and "ran alone" in got["heal_void"]


# ---- goals -------------------------------------------------------------------------------------
def cell(**figures):
    return {"global_batch": {"before": 96, "after": 64, "after_min": 64}, **figures} | {
        "samples_replayed": 0,
        "samples_lost": 0,
        "steps_lost": 0,
        "samples_absent": 0,
    }


def rows_of(tt_kill=1.0, ft_kill=(3.0, 2.0), tt_heal=10.0, slow=(8.0, 7.5)):
    kept = {"before": 96, "after": 96, "after_min": 96}
    return {
        "tailtrain-sync": {
            "kill": cell(fault_to_next_step=tt_kill),
            "stop": cell(fault_to_next_step=5.0),
            "heal": cell(heal_seconds=tt_heal, heal_from="peer"),
            "slow": cell(time_to_target=slow[0], bound_time_to_target=slow[1]),
        },
        "tailtrain-deal-demand": {
            "kill": cell(fault_to_next_step=1.0) | {"global_batch": kept},
            "stop": cell(fault_to_next_step=1.0) | {"global_batch": kept},
            "heal": cell(heal_seconds=tt_heal, heal_from="peer") | {"global_batch": dict(kept)},
        },
        "torchft-default": {
            "kill": cell(fault_to_next_step=ft_kill[0]),
            "stop": cell(fault_to_next_step=4.0),
            "heal": cell(heal_seconds=30.0, heal_from="peer"),
            "slow": cell(time_to_target=10.0),
        },
        "torchft-tuned": {
            "kill": cell(fault_to_next_step=ft_kill[1]),
            "stop": cell(fault_to_next_step=None),
            "heal": cell(heal_seconds=None),
            "slow": cell(time_to_target=12.0),
        },
    }


def test_goals_compare_tailtrain_with_torchft_s_best_and_the_bound():
    got = ng.goals(rows_of())
    assert set(got) == set(ng.GOAL_NAMES)
    kill = got["kill_next_step_no_later_than_torchft"]
    assert kill["holds"] is True and kill["by_row"]["tailtrain-sync"]["torchft_best"] == 2.0
    assert got["stop_next_step_no_later_than_torchft"]["holds"] is False  # 5.0 > 4.0
    assert got["heal_no_slower_than_torchft"]["holds"] is True
    assert got["no_sample_lost_or_done_twice"]["holds"] is True
    assert got["slow_time_to_target_at_most_0.85x_torchft"]["holds"] is True  # 8 <= 8.5
    within = got["slow_time_to_target_within_10pct_of_bound"]
    assert within["holds"] is True and within["by_row"]["tailtrain-sync"]["ratio"] == 1.067


def test_a_goal_fails_on_a_slower_figure_or_a_heal_from_a_checkpoint():
    got = ng.goals(rows_of(tt_kill=2.5, tt_heal=40.0, slow=(9.0, 7.0)))
    assert got["kill_next_step_no_later_than_torchft"]["holds"] is False
    assert got["heal_no_slower_than_torchft"]["holds"] is False
    assert got["slow_time_to_target_at_most_0.85x_torchft"]["holds"] is False  # 9 > 8.5
    assert got["slow_time_to_target_within_10pct_of_bound"]["holds"] is False  # 9 > 7.7
    rows = rows_of()
    rows["tailtrain-sync"]["heal"]["heal_from"] = "checkpoint"
    assert ng.goals(rows)["heal_no_slower_than_torchft"]["holds"] is False


def test_the_global_batch_goal_reads_deal_demand_s_drills_and_shows_every_row():
    rows = rows_of()
    goal = ng.goals(rows)["global_batch_kept_after_fault_deal_demand"]
    assert goal["holds"] is True and goal["by_drill"] == {"kill": True, "stop": True, "heal": True}
    assert goal["by_row"]["torchft-default"]["kill"] == {"before": 96, "after": 64, "after_min": 64}
    rows["tailtrain-deal-demand"]["heal"]["global_batch"]["after_min"] = 64  # one step shrank
    assert ng.goals(rows)["global_batch_kept_after_fault_deal_demand"]["holds"] is False
    rows["tailtrain-deal-demand"] = {"refused": "error: no"}
    goal = ng.goals(rows)["global_batch_kept_after_fault_deal_demand"]
    assert goal["holds"] is None and "tailtrain-deal-demand" in goal["why"]


def test_goals_are_null_with_why_without_torchft_or_without_a_tailtrain_row():
    rows = rows_of()
    for name in ns.TORCHFT:
        rows[name] = {"unavailable": "ModuleNotFoundError: No module named 'torchft'"}
    got = ng.goals(rows)
    assert got["kill_next_step_no_later_than_torchft"]["holds"] is None
    assert "no figure of torchft" in got["kill_next_step_no_later_than_torchft"]["why"]
    assert got["slow_time_to_target_within_10pct_of_bound"]["holds"] is True
    none = ng.goals({"tailtrain-sync": {"refused": "error: no"}})
    assert all(g["holds"] is None and "no tailtrain row ran" in g["why"] for g in none.values())


def test_a_sample_done_twice_or_lost_fails_the_books():
    rows = rows_of()
    rows["tailtrain-sync"]["heal"]["samples_replayed"] = 64
    books = ng.goals(rows)["no_sample_lost_or_done_twice"]
    assert books["holds"] is False
    assert books["by_row"]["tailtrain-sync"]["by_drill"]["heal"]["samples_replayed"] == 64


def test_a_refused_row_says_its_one_line():
    cell_ = {
        "status": [2, 2, 2],
        "error": "no step committed",
        "log_tail": {"node0-1": ["tailtrain: error: rebalance cannot shrink"]},
    }
    assert bn.refused(cell_) == "tailtrain: error: rebalance cannot shrink"
    assert bn.refused({"status": [0, 0, 1], "error": "no step committed"}) is None
    assert bn.refused({"status": "stalled"}) is None


# ---- repeats -----------------------------------------------------------------------------------
def test_repeats_name_every_drill_or_some():
    assert bn.parse_repeats("2") == dict.fromkeys(ns.DRILLS, 2)
    assert bn.parse_repeats("heal=3,slow=3") == {"heal": 3, "slow": 3}
    cfg, _, _ = bn.parse(["--repeats", "heal=3"])
    assert cfg.repeats == {"heal": 3}


def test_a_drill_run_several_times_keeps_its_median_run_and_every_figure():
    runs = [
        cell(heal_seconds=12.0, heal_from="peer", status=[0, 0, 0]),
        cell(heal_seconds=10.0, heal_from="peer", status=[0, 0, 0]),
        cell(heal_seconds=11.0, heal_from="peer", status=[0, 0, 0]),
    ]
    got = bn.median_run(runs, "heal_seconds")
    assert got["heal_seconds"] == 11.0 and got["repeats_failed"] == 0
    assert [r["heal_seconds"] for r in got["repeats"]] == [12.0, 10.0, 11.0]
    assert bn.median_run(runs[:1], "heal_seconds") is runs[0]  # one run: as it is
    runs[1]["heal_seconds"] = None  # a run that did not heal counts as the slowest
    got = bn.median_run(runs, "heal_seconds")
    assert got["heal_seconds"] == 12.0 and got["repeats_failed"] == 1


def test_a_run_of_several_that_failed_fails_its_goal_even_with_a_good_median():
    rows = rows_of()
    healed = rows["tailtrain-sync"]["heal"]
    rows["tailtrain-sync"]["heal"] = bn.median_run(
        [dict(healed), dict(healed), dict(healed, heal_seconds=None)], "heal_seconds"
    )
    heal = ng.goals(rows)["heal_no_slower_than_torchft"]
    assert heal["holds"] is False
    assert heal["by_row"]["tailtrain-sync"]["runs"] == [10.0, 10.0, None]
    rows = rows_of()
    slow = rows["tailtrain-sync"]["slow"]
    rows["tailtrain-sync"]["slow"] = bn.median_run(
        [dict(slow), dict(slow, time_to_target=None), dict(slow)], "time_to_target"
    )
    assert ng.goals(rows)["slow_time_to_target_at_most_0.85x_torchft"]["holds"] is False


def test_the_books_read_every_run_of_a_drill_run_several_times():
    rows = rows_of()
    kill = rows["tailtrain-sync"]["kill"]
    rows["tailtrain-sync"]["kill"] = bn.median_run(
        [dict(kill), dict(kill, samples_lost=32, fault_to_next_step=5.0), dict(kill)],
        "fault_to_next_step",
    )
    books = ng.goals(rows)["no_sample_lost_or_done_twice"]
    assert books["holds"] is False
    assert books["by_row"]["tailtrain-sync"]["bad"] == ["kill (run 2)"]
