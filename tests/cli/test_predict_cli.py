"""`tailtrain predict`: the two documented examples and one-line errors for bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.cli.helpers import run

THEORY = {
    "sync",
    "k-sync",
    "k-batch-sync",
    "k-async",
    "k-batch-async",
    "async",
    "dropcompute",
    "rebalance",
}
FAMILIES = {"local-sgd", "eager-solo", "eager-majority", "eager-quorum", "dbw"}
STRATEGIES = THEORY | FAMILIES
ROW_KEYS = {"strategy", "k", "iteration_time", "speedup_vs_sync", "method"}


def check_contract(payload, workers):
    assert {"scenario", "results"} <= set(payload)
    rows = payload["results"]
    assert {r["strategy"] for r in rows} == STRATEGIES
    for row in rows:
        assert set(row) >= ROW_KEYS and "effective_speedup" in row
        assert row["iteration_time"] > 0 and row["speedup_vs_sync"] > 0
    dropcompute = [r for r in rows if r["strategy"] == "dropcompute"]
    assert len(dropcompute) == 1
    assert {"threshold", "drop_rate", "effective_speedup"} <= set(dropcompute[0])
    for strategy in ("k-sync", "k-batch-sync", "k-async", "k-batch-async"):
        ks = [r["k"] for r in rows if r["strategy"] == strategy]
        assert len(ks) == len(set(ks)) and max(ks) == workers and min(ks) == 1
        assert sum(r["best"] for r in rows if r["strategy"] == strategy) == 1
    return rows


def test_example_exponential_16_workers(capsys):
    code, out, err = run(["predict", "--workers", "16", "--delay", "exp:rate=1", "--json"], capsys)
    assert code == 0 and err == ""
    rows = check_contract(json.loads(out), 16)
    for strategy in ("k-sync", "k-batch-sync", "k-async", "k-batch-async"):
        assert sorted(r["k"] for r in rows if r["strategy"] == strategy) == list(range(1, 17))
    sync = next(r for r in rows if r["strategy"] == "sync")
    assert sync["k"] == 16 and sync["speedup_vs_sync"] == 1.0 and sync["method"] == "exact"


def test_example_dropcompute_200_workers(capsys):
    argv = [
        "predict", "--workers", "200", "--micro-batches", "12",
        "--delay", "const:value=0.5+dropcompute-noise:scale=0.5", "--json",
    ]  # fmt: skip
    code, out, err = run(argv, capsys)
    assert code == 0 and err == ""
    payload = json.loads(out)
    rows = check_contract(payload, 200)
    assert payload["scenario"]["micro_batches"] == 12
    assert len(rows) < 100  # a documented K grid, not 4 x 200 rows
    dropcompute = next(r for r in rows if r["strategy"] == "dropcompute")
    assert dropcompute["effective_speedup"] > 1 and 0 < dropcompute["drop_rate"] < 0.5
    # a sum of 12 bounded micro-batches has an exact numerical law (theory.sums): no sampling
    assert dropcompute["method"] == "fft-convolution+numerical-integration"
    assert dropcompute["effective_speedup_stderr"] == 0


def test_human_table(capsys):
    code, out, _ = run(["predict", "--workers", "6", "--delay", "uniform:low=1,high=2"], capsys)
    assert code == 0
    for strategy in THEORY | {"local-sgd:period=", "eager:mode=quorum,k=", "dbw"}:
        assert strategy in out
    assert "*" in out and "numerical-integration" in out


def test_k_option_restricts_rows(capsys):
    argv = ["predict", "--workers", "8", "--delay", "exp:rate=1", "--k", "2,8", "--json"]
    code, out, _ = run(argv, capsys)
    rows = json.loads(out)["results"]
    assert code == 0 and {r["k"] for r in rows if r["strategy"] == "k-sync"} == {2, 8}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--workers", "4", "--delay", "weibull:shape=2"], "weibull"),
        (["--workers", "4", "--delay", "exp"], "rate"),
        (["--workers", "4", "--delay", "uniform:low=-1,high=2"], "low"),
        (["--workers", "4", "--delay", "exp:rate"], "malformed"),
        (["--workers", "0", "--delay", "exp:rate=1"], "workers"),
        (["--workers", "4", "--delay", "exp:rate=1", "--k", "5"], "--k 5"),
        (["--workers", "4", "--delay", "exp:rate=1", "--micro-batches", "0"], "micro-batches"),
        (["--workers", "4", "--delay", "trace:path=/nonexistent/t.csv"], "cannot read"),
        (["--workers", "4", "--delay", "exp:rate=1", "--comm-time", "-1"], "comm-time"),
        (["--workers", "four", "--delay", "exp:rate=1"], "workers"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    code, out, err = run(["predict", *args], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert needle in err and "Traceback" not in err


def test_family_rows_name_their_method_and_parse(capsys):
    """Local-SGD on Exp(1) has a closed form: a round of H steps is the max of N Gamma(H, 1)
    sums; eager rows are simulated; every extra row's spec parses."""
    from scipy import integrate, stats

    from tailtrain.strategies.registry import parse_strategy

    code, out, _ = run(["predict", "--workers", "4", "--delay", "exp:rate=1", "--json"], capsys)
    rows = json.loads(out)["results"]
    assert code == 0
    for row in rows:
        if row["strategy"] in FAMILIES:
            parse_strategy(row["spec"])
    local = {r["spec"]: r for r in rows if r["strategy"] == "local-sgd"}
    law = stats.gamma(4)  # H = 4
    expected = integrate.quad(lambda x: 1 - law.cdf(x) ** 4, 0, np.inf)[0]
    assert local["local-sgd:period=4"]["iteration_time"] == pytest.approx(expected, rel=1e-7)
    assert sum(r["best"] for r in local.values()) == 1
    eager = [r for r in rows if r["strategy"].startswith("eager")]
    assert eager and all(r["method"].startswith("simulated(") for r in eager)


@pytest.mark.timeout(120)
def test_predict_answers_for_a_million_workers(capsys):
    argv = ["predict", "--workers", str(10**6), "--delay", "exp:rate=1", "--json"]
    code, out, _ = run(argv, capsys)
    rows = json.loads(out)["results"]
    assert code == 0 and sum(r["best"] for r in rows if r["strategy"] == "k-sync") == 1
    sync = next(r for r in rows if r["strategy"] == "sync")
    harmonic = float(np.log(10**6) + np.euler_gamma + 1 / (2 * 10**6))
    assert sync["iteration_time"] == pytest.approx(harmonic, rel=1e-9)
