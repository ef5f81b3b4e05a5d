"""The probe's live verdicts on generated own-times: the reference is the fastest half."""

from __future__ import annotations

import numpy as np

from tailtrain.integrate.verdicts import LIVE_MIN_STEPS, judge_ranks


def own(steps=40, ranks=6, seed=0):
    rng = np.random.default_rng(seed)
    return 0.05 * rng.lognormal(0.0, 0.02, (steps, ranks))


def verdicts(times):
    return [v.verdict for v in judge_ranks(times)]


def test_two_slow_ranks_of_four_are_persistent_and_scored_against_the_fast_ones():
    times = own(ranks=4)
    times[:, [1, 3]] *= 1.2
    found = judge_ranks(times)
    assert [v.verdict for v in found] == ["healthy", "persistent", "healthy", "persistent"]
    assert [round(v.score, 1) for v in found] == [1.0, 0.8, 1.0, 0.8]  # 1 / 1.2


def test_a_stall_of_five_steps_is_intermittent_and_noise_is_healthy():
    times = own()
    assert verdicts(times) == ["healthy"] * 6
    times[20:25, 2] *= 3
    assert verdicts(times) == [
        "healthy",
        "healthy",
        "intermittent",
        "healthy",
        "healthy",
        "healthy",
    ]
    times[30, 4] *= 3  # one slow step is not a stall
    assert verdicts(times)[4] == "healthy"


def test_no_verdict_before_enough_steps():
    assert judge_ranks(own(steps=LIVE_MIN_STEPS - 1)) == []
    assert judge_ranks(own(ranks=1)) == []
