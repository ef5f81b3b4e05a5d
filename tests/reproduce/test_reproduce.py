"""`tailtrain reproduce`: the list, every quick experiment end to end, and bad input."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from tailtrain.cli import main
from tailtrain.reproduce import registry
from tailtrain.reproduce.registry import EXPERIMENTS, Experiment
from tailtrain.reproduce.report import Report
from tailtrain.reproduce.runs import Sizes

#: the figures and tables the reproductions must cover (tracker issue 13)
REQUIRED = {
    "dropcompute-fig1": "Fig. 1",
    "dropcompute-fig3": "Fig. 3",
    "dropcompute-c3": "App. C.3",
    "dropcompute-table1": "Table 1",
    "dbw-fig6": "Fig. 6",
    "dbw-fig8": "Fig. 8",
    "dbw-fig9": "Fig. 9",
    "dbw-fig10": "Fig. 10",
    "eager-fig9": "Fig. 9",
    "eager-fig10": "Fig. 10",
    "eager-fig12": "Fig. 12",
    "stale-fig6": "Fig. 6",
    "stale-fig7": "Fig. 7",
    "stale-fig9-10": "Figs. 9-10",
    "stale-fig11": "Fig. 11",
    "lgc-fig3": "Fig. 3",
    "lgc-fig5": "Fig. 5",
    "lgc-fig6": "Fig. 6",
}


def test_list_names_every_experiment_with_its_sizes(capsys):
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for name, figure in REQUIRED.items():
        row = next(line for line in lines if line.startswith(name + " "))
        assert figure in row
    assert out.count("quick:") == len(EXPERIMENTS) == out.count("; full:")


def test_unknown_name_is_one_line_and_status_2(capsys, tmp_path):
    assert main(["reproduce", "no-such-figure", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-figure" in err and "--list" in err


def test_name_and_out_are_required(capsys, tmp_path):
    assert main(["reproduce"]) == 2
    assert main(["reproduce", "dbw-fig9"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("tailtrain reproduce: error:") for line in err)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [e.name for e in EXPERIMENTS])
def test_each_quick_experiment_writes_a_report_and_its_plots(name, tmp_path, capsys):
    """One experiment a test (CI's workers share them out: ``all`` in one test was the
    suite's longest, 5 minutes under load)."""
    assert main(["reproduce", name, "--out", str(tmp_path), "--quick"]) == 0
    assert name in capsys.readouterr().out
    report = (tmp_path / "report.md").read_text()
    pngs = list(tmp_path.glob("*.png"))
    assert pngs, name
    for section in ("## What the paper shows", "## Ours", "## Gaps", "| --- |"):
        assert section in report, (name, section)
    for png in pngs:
        assert f"]({png.name})" in report  # every plot is linked from the report
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_all_runs_every_experiment_into_a_folder_of_its_own_and_writes_an_index(
    tmp_path, capsys, monkeypatch
):
    """``all`` over two stand-in experiments (each real one has its test above)."""

    def stand_in(name: str) -> Experiment:
        def run(out: Path, quick: bool) -> Report:
            plt.figure().savefig(out / "plot.png")
            plt.close("all")
            return Report(name, "Paper", "Fig. 1", "t", plots=[out / "plot.png"], quick=quick)

        return Experiment(name, "Paper", "Fig. 1", "d", Sizes(quick={}, full={}), run)

    fakes = [stand_in("one"), stand_in("two")]
    monkeypatch.setattr(registry, "EXPERIMENTS", fakes)
    assert main(["reproduce", "all", "--out", str(tmp_path), "--quick"]) == 0
    printed = capsys.readouterr().out
    assert "total" in printed
    index = (tmp_path / "index.md").read_text()
    for fake in fakes:
        assert f"[{fake.name}]({fake.name}/report.md)" in index
        report = (tmp_path / fake.name / "report.md").read_text()
        assert "](plot.png)" in report and "--quick" in report
