"""bench/bench_hook_round.py: one short run of every row on 2 gloo ranks (its report's shape,
each row measured, the ratios from those runs), and its refusals of settings it cannot run."""

from __future__ import annotations

import math

import pytest

from bench import bench_hook_round as bh


@pytest.mark.timeout(120)
def test_one_short_repeat_measures_every_row_and_derives_the_ratios():
    args = bh.argparse.Namespace(repeats=1, steps=bh.WARMUP + 4, m=2, compute=0.0)
    case = bh.measure(2, args)
    assert set(case["ms_per_step"]) == set(bh.ROWS)
    assert all(ms > 0 and math.isfinite(ms) for ms in case["ms_per_step"].values())
    ms = case["ms_per_step"]
    assert case["ratios"]["hook_over_gathered"] == pytest.approx(ms["hook"] / ms["hook-gathered"])
    assert case["ratios"]["a_a_ddp_again_over_ddp"] == pytest.approx(ms["ddp-again"] / ms["ddp"])
    assert case["hook_saving_ms"] == pytest.approx(ms["hook-gathered"] - ms["hook"])


@pytest.mark.parametrize(
    "argv", [["--repeats", "0"], ["--steps", "5"], ["--m", "0"], ["--compute", "nan"]]
)
def test_settings_it_cannot_run_are_refused_before_any_rank_starts(argv, capsys):
    with pytest.raises(SystemExit) as done:
        bh.main(argv)
    assert done.value.code == 2
    assert "Traceback" not in capsys.readouterr().err
