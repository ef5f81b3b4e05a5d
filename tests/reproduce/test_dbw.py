"""DBW Fig. 9 (``reproduce.dbw``): after half the workers slow down 5x, k_t settles at 8."""

from __future__ import annotations

import pytest

from tailtrain.core.scenario import Scenario
from tailtrain.reproduce.dbw import FIG9_DBW_OPTION, FIG9_OPTION, share_at
from tailtrain.reproduce.runs import run

SLOWDOWN = Scenario(
    task="logreg",
    workers=16,
    delay="const:value=1",
    pattern="slowdown:at=160,fraction=0.5,factor=5",
    time_budget=500,
)


@pytest.mark.timeout(120)
def test_b_dbw_with_the_time_window_settles_at_k_8():
    # the run: b-dbw follows the slowdown with the option, not with Eq. (17) as written
    windowed = run(SLOWDOWN, f"b-dbw:mode=psw,{FIG9_OPTION}")
    assert share_at(windowed, 8, 260.0) >= 0.9
    assert share_at(run(SLOWDOWN, "b-dbw:mode=psw,beta=1.2"), 8, 260.0) < 0.9


@pytest.mark.timeout(120)
def test_dbw_with_the_pooled_lipschitz_settles_at_k_8():
    # the command (about 3 s of CPU): only with L_hat pooled does DBW's gain stop
    # falling back to k = n on the noise of Eq. (12)
    pooled = run(SLOWDOWN, f"dbw:mode=psw,{FIG9_DBW_OPTION}")
    assert share_at(pooled, 8, 260.0) >= 0.9
    assert share_at(run(SLOWDOWN, f"dbw:mode=psw,{FIG9_OPTION}"), 8, 260.0) < 0.9
