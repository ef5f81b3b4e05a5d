"""`tailtrain advise`: the --json contract, --out files and one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tests.cli.helpers import run, spiky_micro_batch_trace

from tailtrain.strategies.registry import parse_strategy

ROOT = Path(__file__).resolve().parents[2]


def write_trace(path, times):
    rows = [f"{i},{w},{t:.9f}" for (i, w), t in np.ndenumerate(times)]
    path.write_text("iteration,worker,seconds\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.slow
def test_json_contract_and_out_folder(tmp_path, capsys):
    times = np.random.default_rng(7).lognormal(0.0, 0.5, (40, 6))
    times[:, 1] *= 3
    path = write_trace(tmp_path / "t.csv", times)
    code, out, err = run(
        ["advise", "--trace", str(path), "--json", "--out", str(tmp_path / "o")], capsys
    )
    assert code == 0, err
    payload = json.loads(out)
    assert {"recommendation", "stragglers", "results"} <= set(payload)
    parse_strategy(payload["recommendation"])
    assert [s["worker"] for s in payload["stragglers"] if s["verdict"] == "persistent"] == [1]
    assert all({"worker", "score", "verdict"} <= set(s) for s in payload["stragglers"])
    for row in payload["results"]:
        assert {"strategy", "k", "iteration_time", "speedup_vs_sync", "method", "spec"} <= set(row)
        parse_strategy(row["spec"])
    assert json.loads((tmp_path / "o" / "advice.json").read_text()) == payload
    assert (tmp_path / "o" / "heatmap.png").stat().st_size > 0


def test_the_text_names_the_comm_time_inside_syncs_step(tmp_path, capsys):
    # E[T] = mean worker time + wait + T^c: without T^c named the printed figures do not add up
    times = np.random.default_rng(7).lognormal(0.0, 0.5, (40, 4))
    path = write_trace(tmp_path / "t.csv", times)
    code, out, err = run(["advise", str(path), "--comm-time", "0.5"], capsys)
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("sync E[T]"))
    assert "T^c 0.5 s of it" in line


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        (None, [], "cannot read trace file"),
        ("iteration,worker,seconds\n0,0,abc\n", [], "not a number"),
        ("iteration,worker,seconds\n0,0,1\n0,1,1\n", ["--workers", "0"], "--workers must be >= 1"),
    ],
)
def test_bad_input_gets_one_line_and_status_2(tmp_path, capsys, content, extra, message):
    path = tmp_path / "t.csv"
    if content is not None:
        path.write_text(content)
    code, out, err = run(["advise", "--trace", str(path), *extra], capsys)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1


@pytest.mark.slow
def test_patch_without_edits_for_the_choice_is_one_line_not_an_empty_diff(tmp_path, capsys):
    # a trace with micro-batches: DropCompute runs the job's own M, whose lines (a step's
    # micro-batches to the hook) have no edits; an empty diff would read "nothing to change"
    path = tmp_path / "t.csv"
    path.write_text(spiky_micro_batch_trace())
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    code, out, err = run(["advise", str(path), "--for", "ddp", "--json"], capsys)
    assert code == 0 and json.loads(out)["recommendation"].startswith("dropcompute"), err
    code, out, err = run(["advise", str(path), "--for", "ddp", "--patch", str(script)], capsys)
    assert code == 2 and out == ""
    assert "adopt the printed lines by hand" in err and err.count("\n") == 1


def test_patch_names_the_script_as_patch_p1_finds_it_from_here(tmp_path, capsys, monkeypatch):
    """The README runs ``advise ... --patch examples/probe_ddp.py > adopt.diff`` and then
    ``patch -p1 < adopt.diff`` from the repository's root: the diff must name
    ``examples/probe_ddp.py`` (it named ``probe_ddp.py``, which ``patch`` did not find)."""
    rng = np.random.default_rng(0)
    rows = ["iteration,worker,seconds,noncompute,samples,run"]
    for i in range(60):
        times = np.array([0.01, 0.05]) * rng.lognormal(0, 0.05, 2)
        rows += [f"{i},{w},{times[w]},{times.max() - times[w] + 0.002},32,0" for w in (0, 1)]
    (tmp_path / "trace.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "examples").mkdir()
    script = tmp_path / "examples" / "probe_ddp.py"
    script.write_text((ROOT / "examples" / "probe_ddp.py").read_text())
    monkeypatch.chdir(tmp_path)
    patch = ["--patch", "examples/probe_ddp.py"]
    code, out, err = run(["advise", "trace.csv", "--for", "ddp", *patch], capsys)
    assert code == 0, err
    assert out.splitlines()[:2] == ["--- a/examples/probe_ddp.py", "+++ b/examples/probe_ddp.py"]
    if shutil.which("patch") is not None:
        done = subprocess.run(["patch", "-p1"], input=out, text=True, capture_output=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "rebalance_loader(" in script.read_text()
