"""What a reproduction writes: ``report.md`` with the paper's numbers beside ours, and the gaps.

A :class:`Report` holds what the paper shows (quoted where its text gives numbers, otherwise
the qualitative claim and a note that the number is only in the figure), our tables, the plots
and one sentence per gap. :func:`gap` formats such a sentence from the two numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the papers' numbers are printed as figures only: our note when no number is in the text
FIGURE_ONLY = "no number in the paper's text; the figure shows it only as a curve"


@dataclass
class Table:
    """A markdown table: a caption, column names and rows of cells (numbers are formatted)."""

    caption: str
    columns: Sequence[str]
    rows: list[Sequence[Any]] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row of {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(cells)

    def markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |"
        rule = "| " + " | ".join("---" for _ in self.columns) + " |"
        body = ["| " + " | ".join(cell(c) for c in row) + " |" for row in self.rows]
        return "\n".join([f"**{self.caption}**", "", head, rule, *body])


def cell(value: Any) -> str:
    """A table cell: floats to 4 significant digits, None and NaN as a dash."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:.4g}"
    return str(value).replace("|", "\\|")


@dataclass
class Report:
    """One experiment's findings; :meth:`write` puts ``report.md`` next to its plots."""

    name: str
    paper: str
    figure: str
    title: str
    setup: str = ""
    paper_shows: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    quick: bool = False
    seconds: float = math.nan
    #: ``reproduce --task``'s task, run in place of the experiment's own (None: its own)
    task: str | None = None

    def markdown(self) -> str:
        size = "--quick" if self.quick else "full size"
        lines = [
            f"# {self.paper}, {self.figure}: {self.title}",
            "",
            f"Experiment `{self.name}` ({size}), written by "
            f"`tailtrain reproduce {self.name} --out DIR{' --quick' if self.quick else ''}"
            f"{'' if self.task is None else f' --task {self.task}'}` "
            f"in {self.seconds:.1f} s of wall-clock time.",
            "",
            "## Setup",
            "",
            self.setup,
            "",
            "## What the paper shows",
            "",
            *[f"- {claim}" for claim in self.paper_shows],
            "",
            "## Ours",
            "",
        ]
        for table in self.tables:
            lines += [table.markdown(), ""]
        lines += [f"![{plot.stem}]({plot.name})" for plot in self.plots]
        lines += ["", "## Gaps", ""]
        if self.task is not None:
            # the gaps' reasons were worked out on the experiment's own task, not on this one
            lines += [
                f"Run on `{self.task}` in place of the experiment's own task: the figures are "
                "this run's, but the reasons given for each gap were worked out on the "
                "experiment's own task and may not hold here.",
                "",
            ]
        lines += [*[f"- {gap}" for gap in self.gaps], ""]
        return "\n".join(lines)

    def write(self, out: Path) -> Path:
        path = Path(out) / "report.md"
        path.write_text(self.markdown())
        return path


def ratio(ours: float, paper: float) -> str:
    """'ours/paper = 0.93' style text, or 'n/a' when either is missing."""
    if not (math.isfinite(ours) and math.isfinite(paper)) or paper == 0:
        return "n/a"
    return f"ours/paper = {ours / paper:.3g}"


def gap(what: str, paper: float | str, ours: float, why: str, unit: str = "") -> str:
    """One sentence on a gap: the two numbers, their ratio and the reason."""
    if isinstance(paper, str):
        return f"{what}: paper {paper}, ours {cell(float(ours))}{unit}. {why}"
    return (
        f"{what}: paper {cell(float(paper))}{unit}, ours {cell(float(ours))}{unit} "
        f"({ratio(float(ours), float(paper))}). {why}"
    )
