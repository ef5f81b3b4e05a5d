"""The one persistence rule: its verdicts on generated own-times, and the same verdict from the
probe's live path and from advise's path (the probe's trace.csv read back) on the same data."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailtrain.advice.stragglers import iteration_times, score_workers
from tailtrain.delays.parse import parse_delay
from tailtrain.integrate.probe import LIVE_MIN_STEPS, StragglerProbe
from tailtrain.persistence import MIN_EFFECT, classify_workers, too_few_steps


def own(steps=40, ranks=6, seed=0, sigma=0.02):
    rng = np.random.default_rng(seed)
    return 0.05 * rng.lognormal(0.0, sigma, (steps, ranks))


def verdicts(times):
    return [v.verdict for v in classify_workers(times)]


def test_two_slow_ranks_of_four_are_persistent_and_scored_against_the_others():
    times = own(ranks=4)
    times[:, [1, 3]] *= 1.2
    found = classify_workers(times)
    assert [v.verdict for v in found] == ["healthy", "persistent", "healthy", "persistent"]
    # against the others' median (one slow rank among them): about 1 / 1.2
    assert [round(v.score, 1) for v in found] == [1.0, 0.8, 1.0, 0.8]


def test_a_stall_of_five_steps_is_intermittent_and_one_slow_step_is_not():
    times = own()
    assert verdicts(times) == ["healthy"] * 6
    times[20:25, 2] *= 3
    times[30, 4] *= 3
    assert verdicts(times) == ["healthy", "healthy", "intermittent"] + ["healthy"] * 3


def test_recurring_stalls_are_intermittent_and_heavy_noise_alone_is_healthy():
    """The sign test's null is exact under noise that treats the workers alike: lognormal
    noise of sigma 0.5 (a 1.8x step is common) names nobody; a worker 4x slower in every fifth
    step (never two in a row) is intermittent, not persistent."""
    times = own(steps=200, ranks=12, seed=4, sigma=0.5)
    assert verdicts(times) == ["healthy"] * 12
    times[::5, 7] *= 4
    assert [i for i, v in enumerate(verdicts(times)) if v != "healthy"] == [7]
    assert verdicts(times)[7] == "intermittent"


def test_the_effect_must_hold_across_the_windows_not_in_one_burst():
    times = own()
    times[:26, 3] *= 1.5  # slow in 26 of 40 steps: median and sign test say slow, not 3 of 4
    found = classify_workers(times)[3]  # windows of 5
    assert found.slowdown >= MIN_EFFECT and found.p_value < 1e-4 and found.slow_windows < 0.75
    assert found.verdict == "healthy"
    times = own()
    times[:, 3] *= MIN_EFFECT * 1.05
    assert verdicts(times)[3] == "persistent"


def probe_verdicts(folder, window: np.ndarray) -> list[str]:
    """The probe's live path on rank 0: its report of a gathered window (steps x ranks x
    (data, compute, wait), samples not known); the gather is a collective, so the window is
    handed in as it would arrive. Writes the probe's trace.csv in ``folder``."""
    probe = StragglerProbe(folder, every=10**6, horizon=10**6, warmup=0)
    probe.world = window.shape[1]
    unknown = np.full((*window.shape[:2], 1), np.nan)  # the samples column: not known
    window = np.concatenate([window, unknown], axis=2)
    probe.history = np.empty((0, *window.shape[1:]))
    probe._report(window)
    return [v.verdict for v in probe.last.verdicts]


def advise_verdicts(folder) -> list[str]:
    """advise's path: the probe's trace.csv as ``advise DIR`` reads it, scored."""
    replay = parse_delay(f"trace:path={folder / 'trace.csv'}").replay
    times, _ = iteration_times(replay)
    return [s.verdict for s in score_workers(times, replay.ids)]


@st.composite
def windows(draw):
    steps = draw(st.integers(LIVE_MIN_STEPS, 60))
    ranks = draw(st.integers(2, 8))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    sigma = draw(st.sampled_from([0.0, 0.01, 0.05, 0.2, 0.5]))
    own = 0.05 * rng.lognormal(0.0, sigma, (steps, ranks))
    slow = draw(st.lists(st.integers(0, ranks - 1), max_size=2, unique=True))
    for rank in slow:  # a persistent slowdown around the rule's thresholds, or a stall
        if draw(st.booleans()):
            own[:, rank] *= draw(st.sampled_from([1.05, 1.1, 1.15, 1.2, 1.5, 2.0]))
        else:
            first = draw(st.integers(0, steps - 1))
            own[first : first + draw(st.integers(1, 12)), rank] *= 3.0
    data = own * rng.uniform(0.0, 0.3, own.shape)
    wait = rng.uniform(0.0, 0.02, own.shape)
    return np.stack([data, own - data, wait], axis=2)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(window=windows())
def test_the_probe_and_advise_give_the_same_verdicts_on_the_same_data(tmp_path_factory, window):
    folder = tmp_path_factory.mktemp("probe")
    assert probe_verdicts(folder, window) == advise_verdicts(folder)


def test_a_rank_at_1_15x_gets_one_verdict_from_both_paths(tmp_path):
    """The case that split the two old rules (the probe's 1.1x-of-the-fastest-half against
    advise's 1.2x-of-the-median): now one rule, one verdict."""
    rng = np.random.default_rng(7)
    own = 0.05 * rng.lognormal(0.0, 0.02, (40, 6))
    own[:, 2] *= 1.15
    window = np.stack([0.1 * own, 0.9 * own, np.zeros_like(own)], axis=2)
    found = probe_verdicts(tmp_path, window)
    assert found == advise_verdicts(tmp_path) == ["healthy"] * 2 + ["persistent"] + ["healthy"] * 3


def test_a_rank_slower_in_every_one_of_too_few_steps_is_said_to_be_too_few():
    """10 steps of rank 1 26x slower: the binomial test cannot reach its level (2^-10 against
    1e-3 / 2), so the verdict is not persistent, and ``too_few_steps`` says why (the probe's
    first report read "intermittent ... slower in 100% of steps"); at 40 steps it is
    persistent, and a healthy rank is never too few."""
    rng = np.random.default_rng(0)
    times = np.array([0.001, 0.026]) * rng.lognormal(0, 0.05, (40, 2))
    early = classify_workers(times[:10])
    assert early[1].verdict != "persistent" and too_few_steps(early[1], 2)
    assert not too_few_steps(early[0], 2)
    late = classify_workers(times)
    assert late[1].verdict == "persistent" and not too_few_steps(late[1], 2)
