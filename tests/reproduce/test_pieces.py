"""Pieces of the reproductions that carry their own logic: tables, sizes, the LGC ablation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailtrain.core.records import RunRecord
from tailtrain.reproduce.lgc import UnscaledLgc, lgc
from tailtrain.reproduce.report import Report, Table, gap
from tailtrain.reproduce.runs import Sizes
from tailtrain.reproduce.stale import _fig11_verdict, _seed_times
from tailtrain.strategies.base import Context
from tailtrain.strategies.registry import parse_strategy
from tailtrain.strategies.testing import arrivals, weights


def test_table_markdown_formats_cells():
    table = Table("caption", ["a", "b", "c"])
    table.add(1, 0.123456, None)
    table.add("x|y", math.nan, 2.0)
    lines = table.markdown().splitlines()
    assert lines[2:] == [
        "| a | b | c |",
        "| --- | --- | --- |",
        "| 1 | 0.1235 | - |",
        "| x\\|y | - | 2 |",
    ]
    with pytest.raises(ValueError):
        table.add(1, 2)


def test_gap_sentence_has_both_numbers_and_their_ratio():
    text = gap("speedup", 2.0, 1.5, "because.", unit="x")
    assert text == "speedup: paper 2x, ours 1.5x (ours/paper = 0.75). because."


def test_report_links_its_plots(tmp_path):
    report = Report("n", "P", "Fig. 1", "t", plots=[tmp_path / "a.png"], gaps=["g"])
    text = report.write(tmp_path).read_text()
    assert "![a](a.png)" in text and "- g" in text


def test_sizes_pick_and_describe():
    sizes = Sizes(quick={"n": (1, 2), "k": 3}, full={"n": (1, 2, 4), "k": 5})
    assert sizes.pick(True).k == 3 and sizes.pick(False).n == (1, 2, 4)
    assert sizes.describe() == "quick: n=1,2 k=3; full: n=1,2,4 k=5"


def test_unscaled_lgc_weights_partial_work_one_over_n():
    """LGC Eq. (7) without Eq. (6)'s r/s: e_t = 1/N sum_stragglers g_i - (N-K)/N g'_t, each
    straggler's mean-of-r-blocks gradient at weight 1/N whatever r is (written out here)."""
    scaled = parse_strategy("lgc:k=2,blocks=4")
    unscaled = UnscaledLgc(scaled.name, scaled.k, scaled.blocks)
    n = 4
    state = unscaled.init(Context(n_workers=n, lr=0.1, iterations_per_epoch=10, seed=0))
    cols = arrivals(
        [
            (0, 3, 0.0, 1.0),
            (1, 3, 0.0, 1.5),
            (2, 3, 0.0, 2.0, 0.25, True),
            (3, 3, 0.0, 2.0, 0.0, True),
        ]
    )
    now, later = weights(unscaled.select(state, cols), cols)
    k = 2
    np.testing.assert_allclose(now, [1 / k, 1 / k, 0, 0])
    # fresh: -(N-K)/(N K); straggler with r = 1 of 4 blocks: 1/N (scaled LGC: (1/4)/N);
    # straggler with no finished block: 0, as in Eq. (6) with r = 0
    np.testing.assert_allclose(later, [-(n - k) / (n * k), -(n - k) / (n * k), 1 / n, 0])
    _, scaled_later = weights(scaled.select(scaled.init(Context(n, 0.1, 10, 0)), cols), cols)
    assert scaled_later[2] == pytest.approx(0.25 / n)
    assert unscaled.describe() == "lgc:k=2,blocks=4,scaling=false"


def test_lgc_spec_helper_matches_the_paper_setup():
    assert parse_strategy(lgc()).describe() == "lgc:k=7,blocks=4,warmup=2"


def test_fig11_times_come_from_the_evaluations_and_never_reached_is_inf():
    def record(losses):
        r = RunRecord()
        r.evals = [{"time": float(t), "train_loss": x} for t, x in enumerate(losses)]
        return r

    fast, slow = record([2.0, 1.0, 0.5]), record([2.0, 1.5, 1.0])
    assert _seed_times(fast, (0.5, 0.75)) == [2.0, 1.5]
    assert _seed_times(slow, (0.5,)) == [math.inf]  # never got there


def test_fig11_verdict_needs_a_win_in_every_seed():
    names = ["ada", "k=2", "k=4"]
    # seed times per strategy, one target: AdaSync first in both seeds
    wins = {"ada": [[1.0], [2.0]], "k=2": [[1.5], [2.5]], "k=4": [[3.0], [2.1]]}
    ada, best, ratio, first, verdict = _fig11_verdict(wins, names, 0)
    assert (ada, first, verdict) == (1.5, "2/2", "AdaSync beats every fixed K")
    assert best.endswith("(k=2)") and ratio == pytest.approx(1.5 / 2.0)
    # first in one seed of two: within the spread, whatever the means say
    mixed = {**wins, "k=4": [[0.5], [2.1]]}
    assert _fig11_verdict(mixed, names, 0)[-1] == "within the seed-to-seed spread"
    # a fixed K first in every seed
    loses = {"ada": [[3.0], [math.inf]], "k=2": [[1.5], [2.5]], "k=4": [[3.0], [2.1]]}
    assert _fig11_verdict(loses, names, 0)[-1] == "does not: k=2 is faster"
    tie = {**wins, "k=2": [[1.0], [2.0]]}  # AdaSync had not left K0 = 2 yet
    assert _fig11_verdict(tie, names, 0)[-1].startswith("tie")
    # the same as K0 = 4 but k=2 faster: not a tie
    slower = {"ada": [[2.0], [2.0]], "k=2": [[1.5], [1.5]], "k=4": [[2.0], [2.0]]}
    assert _fig11_verdict(slower, names, 0)[-1] == "does not: k=2 is faster"
    never = {n: [[math.inf], [math.inf]] for n in names}
    assert _fig11_verdict(never, names, 0)[-1] == "neither reaches it in every seed"
