"""`tailtrain simulate collectives`: the Fig. 8 microbenchmark, next to `tailtrain simulate`."""

from __future__ import annotations

import json

import pytest

from tailtrain.cli import main

FIG9 = ["simulate", "collectives", "--procs", "32", "--skew", "linear:step=0.001"]


def test_fig9_json(capsys):
    assert main([*FIG9, "--iterations", "64", "--json", "--hop-latency", "1e-6"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"allreduce", "solo", "majority", "quorum"}
    assert all(set(v) == {"latency", "nap"} for v in out.values())
    # everybody waits for rank 31: mean of (31 - r) ms, plus a 5-hop allreduce
    assert out["allreduce"]["latency"] == pytest.approx(15.5e-3 + 5e-6)
    assert out["allreduce"]["nap"] == 32
    assert out["solo"]["nap"] == 1
    assert out["quorum"]["nap"] == 16
    assert 8 <= out["majority"]["nap"] <= 24
    latency = {k: v["latency"] for k, v in out.items()}
    assert latency["solo"] < latency["quorum"] < latency["allreduce"]
    assert latency["majority"] < latency["allreduce"]


def test_options_change_the_model(capsys):
    main([*FIG9, "--iterations", "4", "--json", "--allreduce-time", "0.002", "--quorum", "8"])
    out = json.loads(capsys.readouterr().out)
    assert out["allreduce"]["latency"] == pytest.approx(15.5e-3 + 2e-3)
    assert out["quorum"]["nap"] == 8
    main([*FIG9, "--iterations", "4", "--json", "--call-overhead", "0.001"])
    assert json.loads(capsys.readouterr().out)["solo"]["latency"] >= 1e-3


def test_table_output(capsys):
    assert main([*FIG9, "--iterations", "8"]) == 0
    text = capsys.readouterr().out
    assert "majority" in text and "NAP" in text


@pytest.mark.parametrize(
    "extra",
    [
        ["--quorum", "40"],
        ["--procs", "0"],
        ["--hop-latency", "-1"],
        ["--skew", "zigzag:step=1"],
    ],
)
def test_bad_input_exits_2_with_one_line(extra, capsys):
    assert main(["simulate", "collectives", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tailtrain simulate: error:") and "\n" not in err


def test_help_describes_the_microbenchmark(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "collectives", "--help"])
    assert exc.value.code == 0
    assert "NAP" in capsys.readouterr().out


def test_plain_simulate_still_works_and_runs_eager(capsys):
    argv = ["simulate", "--task", "none", "--workers", "4", "--iterations", "5", "--json"]
    assert main([*argv, "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["iterations"] == 5
    assert main([*argv, "--no-progress", "--strategy", "eager:mode=majority"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["strategy"] == "eager:mode=majority" and summary["mean_nap"] >= 1
