"""`--group-size G` on simulate, compare and predict (issue 38 item 4): a G that does not
divide the workers, or one below 1, is one line and exit 2 before any work; a good G runs
the groups as the workers."""

from __future__ import annotations

import json

import pytest
from tests.cli.helpers import run

COMMANDS = {
    "simulate": ["simulate", "--task", "none", "--iterations", "5", "--no-progress"],
    "compare": ["compare", "--task", "none", "--iterations", "5", "--no-progress"],
    "predict": ["predict", "--delay", "exp:rate=1"],
}
BAD = [
    (["--workers", "8", "--group-size", "3"], "--group-size 3 does not divide --workers 8"),
    (["--workers", "8", "--group-size", "0"], "--group-size must be >= 1, got 0"),
    (["--workers", "8", "--group-size", "-2"], "--group-size must be >= 1, got -2"),
    (["--workers", "8", "--group-size", "2", "--group-cost", "-1"], "--group-cost must be"),
]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("flags", "needle"), BAD)
def test_a_bad_group_is_one_line_and_exit_2_before_any_work(
    command, flags, needle, capsys, tmp_path, monkeypatch
):
    # no work: neither the simulator nor predict may be reached (the modules imported first,
    # so that none binds the stand-in for good)
    import tailtrain.prediction.estimates as estimates
    import tailtrain.sim.compare as sim_compare
    import tailtrain.sim.run as sim_run

    def reached(*args, **kwargs):
        raise AssertionError("reached the work")

    monkeypatch.setattr(sim_run, "simulate", reached)
    monkeypatch.setattr(sim_compare, "simulate", reached)
    monkeypatch.setattr(estimates, "_Context", reached)
    out = tmp_path / "out"
    extra = ["--out", str(out)] if command != "predict" else []
    code, printed, err = run([*COMMANDS[command], *flags, *extra], capsys)
    assert code == 2
    assert printed == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert not out.exists()


def test_simulate_runs_the_groups(capsys):
    argv = [*COMMANDS["simulate"], "--workers", "8", "--group-size", "4", "--json"]
    argv += ["--group-cost", "0.01", "--micro-batches", "2", "--strategy", "k-sync:k=1"]
    code, printed, err = run(argv, capsys)
    assert code == 0, err
    summary = json.loads(printed)
    assert summary["mean_k"] == 1.0
    assert "8 ranks in 2 replica groups of 4" in summary["groups"]


def test_predict_lists_k_of_groups(capsys):
    argv = [*COMMANDS["predict"], "--workers", "8", "--group-size", "2", "--json"]
    argv += ["--micro-batches", "2", "--k", "all"]
    code, printed, err = run(argv, capsys)
    assert code == 0, err
    payload = json.loads(printed)
    assert payload["scenario"]["group_size"] == 2 and payload["scenario"]["group_cost"] == 0.0
    assert {r["k"] for r in payload["results"] if r["strategy"] == "k-sync"} == {1, 2, 3, 4}
    assert any("replica groups of 2" in note for note in payload["notes"])


@pytest.mark.parametrize(("group", "needle"), [("4", "does not divide --workers 6"), ("0", ">= 1")])
def test_advise_refuses_a_bad_group_in_one_line(group, needle, capsys, tmp_path):
    lines = ["iteration,worker,seconds"]
    lines += [f"{i},{w},{1 + 0.1 * w}" for i in range(10) for w in range(6)]
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(lines) + "\n")
    code, printed, err = run(["advise", str(trace), "--group-size", group], capsys)
    assert code == 2 and printed == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err
