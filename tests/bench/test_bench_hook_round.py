"""bench/bench_hook_round.py: one short run of every row on 2 gloo ranks (its report's shape,
each row measured, the ratios from those runs), and its refusals of settings it cannot run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import bench_hook_round as bh

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 4 runs of 2 ranks, each importing torch: 10-30 s on 2 shared cores
@pytest.mark.timeout(240)
def test_one_short_repeat_measures_every_row_and_derives_the_ratios():
    # a process of its own: the bench forks its ranks, which a test worker's threads (gloo's,
    # a store's, left by earlier tests) could leave holding a lock in the child
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    command = [sys.executable, "bench/bench_hook_round.py", "--ranks", "2", "--repeats", "1"]
    command += ["--steps", str(bh.WARMUP + 4), "--compute", "0", "--json"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    case = json.loads(done.stdout)["cases"]["2"]
    ms = case["ms_per_step"]
    assert set(ms) == set(bh.ROWS)
    assert all(v > 0 and math.isfinite(v) for v in ms.values())
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
