"""The shield of an expendable rank: a death is logged and told, a rank that left alive not."""

from __future__ import annotations

import logging

import pytest

from tailtrain.runtime.expendable import LeftAlive, shielded


def leaves():
    raise LeftAlive("rank 2 came after the census and the run ended first")


def fails():
    raise RuntimeError("boom")


@pytest.mark.timeout(30)
def test_a_rank_that_left_alive_is_no_death(caplog):
    told = []
    with caplog.at_level(logging.WARNING, logger="tailtrain.runtime.expendable"):
        [result] = shielded(leaves, 2, 1, lambda r, why: told.append(r))
    assert told == [] and "LeftAlive: rank 2 came after" in result.record.summary["left"]
    assert "rank 2 left the job" in caplog.text and "died" not in caplog.text


@pytest.mark.timeout(30)
def test_a_rank_that_failed_is_told_dead(caplog):
    told = []
    with caplog.at_level(logging.WARNING, logger="tailtrain.runtime.expendable"):
        [result] = shielded(fails, 1, 1, lambda r, why: told.append((r, why)))
    assert told == [(1, "RuntimeError: boom")] and result.record.summary["dead"] == told[0][1]
    assert "rank 1 died (RuntimeError: boom)" in caplog.text
