"""`tailtrain reproduce`: the list, every quick experiment end to end, and bad input."""

from __future__ import annotations

import pytest

from tailtrain.cli import main
from tailtrain.reproduce.registry import EXPERIMENTS

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


@pytest.mark.timeout(400)
def test_all_quick_writes_a_report_and_a_plot_each(tmp_path, capsys):
    assert main(["reproduce", "all", "--out", str(tmp_path), "--quick"]) == 0
    printed = capsys.readouterr().out
    assert "total" in printed
    for experiment in EXPERIMENTS:
        folder = tmp_path / experiment.name
        report = (folder / "report.md").read_text()
        pngs = list(folder.glob("*.png"))
        assert pngs, experiment.name
        for section in ("## What the paper shows", "## Ours", "## Gaps", "| --- |"):
            assert section in report, (experiment.name, section)
        for png in pngs:
            assert f"]({png.name})" in report  # every plot is linked from the report
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
