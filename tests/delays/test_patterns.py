"""Worker patterns and the block sampler: each pattern's documented effect, seeding, errors."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.delays import PATTERNS, DelayProcess, parse_pattern, sample_times
from tailtrain.errors import UsageError

N, M = 16, 3


def block(model: str, pattern: str | None, iterations: int = 50, seed: int = 7, m=M):
    return DelayProcess(model, pattern, seed, N, m).next_block(iterations)


def test_shapes_with_and_without_micro_batches() -> None:
    assert block("exp:rate=1", None, 5, m=None).shape == (5, N)
    assert block("exp:rate=1", None, 5).shape == (5, N, M)
    assert DelayProcess("exp:rate=1", None, 0, N, M).next_block(0).shape == (0, N, M)


def test_iid_is_the_default_and_changing_the_pattern_keeps_the_base_draws() -> None:
    base = block("exp:rate=1", None)
    np.testing.assert_array_equal(base, block("exp:rate=1", "iid"))
    skewed = block("exp:rate=1", "linear:step=0.01")
    np.testing.assert_allclose((skewed - base)[:, :, 0], np.tile(0.01 * np.arange(N), (50, 1)))


def test_heterogeneous_scales_each_worker_by_one_fixed_draw() -> None:
    base = block("exp:rate=1", None)
    process = DelayProcess("exp:rate=1", "heterogeneous:low=1,high=3", 7, N, M)
    ratio = np.concatenate([process.next_block(20), process.next_block(30)]) / base
    per_worker = ratio[0, :, 0]
    np.testing.assert_allclose(ratio, np.broadcast_to(per_worker[None, :, None], ratio.shape))
    assert per_worker.min() >= 1 and per_worker.max() <= 3 and np.unique(per_worker).size == N


def test_persistent_holds_each_draw_for_h_iterations_across_blocks() -> None:
    h = 5
    process = DelayProcess("exp:rate=1", f"persistent:h={h}", 3, N, M)
    times = np.concatenate([process.next_block(n) for n in (3, 4, 1, 9, 13)])  # 30 iterations
    held = times.reshape(30 // h, h, N, M)
    np.testing.assert_array_equal(held, np.broadcast_to(held[:, :1], held.shape))
    assert np.unique(held[:, 0], axis=0).shape[0] == 30 // h  # a fresh draw every h


def test_persistent_h1_is_iid() -> None:
    np.testing.assert_array_equal(block("exp:rate=1", "persistent:h=1"), block("exp:rate=1", None))


def test_subset_delays_exactly_s_workers_once_per_iteration() -> None:
    s, delay, iterations = 4, 0.46, 4000
    times = block("const:value=1", f"subset:s={s},delay={delay}", iterations)
    hit = times[:, :, 0] > 1
    assert (hit.sum(axis=1) == s).all()
    np.testing.assert_allclose(times[:, :, 0][hit], 1 + delay)
    assert (times[:, :, 1:] == 1).all()  # only the first micro-batch of a worker-iteration
    # every worker equally likely: per-worker counts are Binomial(I, s/N)
    p = s / N
    counts = hit.sum(axis=0)
    assert np.abs(counts - iterations * p).max() <= 5 * math.sqrt(iterations * p * (1 - p))


def test_subset_larger_than_the_cluster_is_refused() -> None:
    with pytest.raises(UsageError, match="only 16"):
        DelayProcess("exp:rate=1", "subset:s=17,delay=0.1", 0, N)


def test_linear_skew_by_rank_as_in_eager_sgd_fig8() -> None:
    times = block("const:value=0", "linear:step=0.001,offset=0.002", 4, m=None)
    np.testing.assert_allclose(times, np.tile(0.002 + 0.001 * np.arange(N), (4, 1)))


def test_rotating_skew_shifts_by_one_rank_per_iteration_across_blocks() -> None:
    process = DelayProcess("const:value=0", "rotating:low=0.05,high=0.4", 0, 8)
    times = np.concatenate([process.next_block(3), process.next_block(10)])
    skew = np.linspace(0.05, 0.4, 8)  # 50, 100, …, 400 ms on 8 processes (eager-SGD §7.2.3)
    for t, row in enumerate(times):
        np.testing.assert_allclose(row, skew[(np.arange(8) + t) % 8])
        np.testing.assert_allclose(np.sort(row), skew)


def test_additive_skews_land_on_the_first_micro_batch_only() -> None:
    base = block("exp:rate=1", None)
    for pattern in ("linear:step=0.1", "rotating", "subset:s=16,delay=0.2"):
        diff = block("exp:rate=1", pattern) - base
        assert (diff[:, :, 1:] == 0).all() and (diff[:, :, 0] > 0).sum() >= (N - 1) * 50


def test_slowdown_slows_a_fixed_fraction_from_time_at_as_in_dbw_4_3() -> None:
    process = DelayProcess("const:value=1", "slowdown:at=160,fraction=0.5,factor=5", 0, N)
    everyone = np.arange(N)
    assert (process.time_factor(np.full(N, 159.9), everyone) == 1).all()
    after = process.time_factor(np.full(N, 160.0), everyone)
    assert sorted(np.unique(after)) == [1, 5] and (after == 5).sum() == N // 2
    np.testing.assert_array_equal(process.time_factor(np.full(N, 1e6), everyone), after)
    assert (process.next_block(3) == 1).all()  # the block itself stays unscaled
    slow = np.flatnonzero(after == 5)
    np.testing.assert_array_equal(process.time_factor([10.0, 200.0], slow[:2]), [1, 5])


def test_slowdown_until_ends_the_event_and_events_compose() -> None:
    process = DelayProcess(
        "exp:rate=1",
        "slowdown:at=10,fraction=1,factor=2,until=20+slowdown:at=15,fraction=1,factor=3",
        0,
        4,
    )
    factors = [process.time_factor(np.full(4, t), np.arange(4))[0] for t in (5, 12, 17, 25)]
    assert factors == [1, 2, 6, 3]


def test_slowdown_set_depends_on_seed_but_is_reproducible() -> None:
    def slow_set(seed: int) -> tuple[int, ...]:
        process = DelayProcess("exp:rate=1", "slowdown:at=0,fraction=0.25,factor=2", seed, 64)
        return tuple(np.flatnonzero(process.time_factor(np.zeros(64), np.arange(64)) > 1))

    assert slow_set(1) == slow_set(1) and len(slow_set(1)) == 16 and slow_set(1) != slow_set(2)


def test_sample_times_refuses_time_scheduled_patterns_and_matches_the_process() -> None:
    with pytest.raises(UsageError, match="virtual times"):
        sample_times("exp:rate=1", "slowdown:at=1,fraction=0.5,factor=2", 0, 10, N)
    np.testing.assert_array_equal(
        sample_times("exp:rate=1", "subset:s=2,delay=1", 5, 10, N, M),
        DelayProcess("exp:rate=1", "subset:s=2,delay=1", 5, N, M).next_block(10),
    )


def test_persistent_must_come_first_in_a_composite() -> None:
    with pytest.raises(UsageError, match="must come first"):
        parse_pattern("linear:step=1+persistent:h=3")
    times = block("exp:rate=1", "persistent:h=2+linear:step=0.5", 4, m=None)
    np.testing.assert_array_equal(times[0], times[1])


def test_negative_draws_are_clipped_with_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="tailtrain.delays.process"):
        times = block("normal:mean=0.1,std=1", None, 20)
    assert times.min() == 0 and "clipped" in caplog.text


# --- seeding ------------------------------------------------------------------------------

MODELS = [
    "exp:rate=2",
    "const:value=0.5+dropcompute-noise:scale=0.5",
    "bernoulli:p=0.2,value=1+gamma:shape=2,rate=4",
]
PATTERN_SPECS = [
    "iid",
    "heterogeneous:low=0.5,high=2",
    "persistent:h=3",
    "subset:s=2,delay=0.3",
    "linear:step=0.01",
    "rotating",
    "slowdown:at=1,fraction=0.5,factor=3",
    "persistent:h=2+subset:s=1,delay=1+heterogeneous:low=1,high=2",
]


def test_every_pattern_name_is_exercised() -> None:
    assert {p.split(":")[0] for spec in PATTERN_SPECS for p in spec.split("+")} == set(PATTERNS)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    model=st.sampled_from(MODELS),
    pattern=st.sampled_from(PATTERN_SPECS),
    seed=st.integers(0, 2**32 - 1),
    blocks=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    micro_batches=st.sampled_from([None, 1, 3]),
)
def test_same_seed_and_calls_give_identical_arrays(model, pattern, seed, blocks, micro_batches):
    def run(generator_seed: int) -> list[np.ndarray]:
        process = DelayProcess(model, pattern, generator_seed, 5, micro_batches)
        return [process.next_block(n) for n in blocks]

    first, again = run(seed), run(seed)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    if sum(blocks):
        assert any(not np.array_equal(a, b) for a, b in zip(first, run(seed + 1), strict=True))


def test_a_generator_works_as_seed_and_is_reproducible() -> None:
    a = DelayProcess("exp:rate=1", None, np.random.default_rng(3), N).next_block(4)
    b = DelayProcess("exp:rate=1", None, np.random.default_rng(3), N).next_block(4)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("sometimes", "unknown worker pattern 'sometimes'"),
        ("iid:x=1", "does not take parameter 'x'"),
        ("heterogeneous:low=2,high=1", "high >= low"),
        ("heterogeneous:low=0,high=1", "must be > 0"),
        ("persistent:h=0", "must be >= 1"),
        ("persistent:h=2.5", "not an integer"),
        ("subset:s=2", "missing parameter 'delay'"),
        ("subset:s=-1,delay=1", "must be >= 0"),
        ("subset:s=1,delay=-0.1", "must be >= 0"),
        ("linear", "missing parameter 'step'"),
        ("rotating:low=0.4,high=0.1", "high >= low"),
        ("slowdown:at=10,fraction=1.5,factor=2", "must be <= 1"),
        ("slowdown:at=10,fraction=0.5,factor=0", "must be > 0"),
        ("slowdown:at=10,fraction=0.5,factor=2,until=5", "until > at"),
        ("slowdown:fraction=0.5,factor=2", "missing parameter 'at'"),
        ("iid+", "malformed pattern"),
        ("", "empty pattern"),
    ],
)
def test_bad_pattern_is_a_one_line_usage_error(spec: str, needle: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_pattern(spec)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_bad_process_arguments_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="workers >= 1"):
        DelayProcess("exp:rate=1", None, 0, 0)
    with pytest.raises(UsageError, match="micro_batches >= 1"):
        DelayProcess("exp:rate=1", None, 0, 4, 0)
    with pytest.raises(UsageError, match="iterations must be >= 0"):
        DelayProcess("exp:rate=1", None, 0, 4).next_block(-1)
