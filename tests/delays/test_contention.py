"""Processor sharing (``delays.contention``): work and durations invert each other, known
timelines come out as computed by hand, and a real trace's position effect is contention."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.delays.contention import shared_durations, unshared_work
from tailtrain.delays.trace import read_trace

DATA = Path(__file__).parent / "data"


@given(
    st.integers(1, 6), st.integers(1, 5), st.integers(1, 8), st.integers(0, 2**32 - 1)
)  # fmt: skip
@settings(max_examples=60, deadline=None)
def test_durations_undo_work(ranks, units, cores, seed):
    """shared_durations(unshared_work(x, C), C) is x, with empty units among them."""
    rng = np.random.default_rng(seed)
    x = rng.exponential(1.0, (7, ranks, units)) * (rng.random((7, ranks, units)) > 0.2)
    done = unshared_work(x, cores)
    assert np.allclose(shared_durations(done, cores), x, rtol=1e-9, atol=1e-12)
    assert np.all(done <= x + 1e-12)  # sharing a core never makes a unit faster
    if cores >= ranks:  # a core each: nothing is shared
        assert np.allclose(done, x)


def test_two_ranks_on_one_core_take_turns_as_computed_by_hand():
    """1 s and 3 s of work on one core: both run at half speed until the first is done at 2 s,
    then the second runs alone for its last 2 s."""
    assert shared_durations(np.array([[[1.0], [3.0]]]), 1) == pytest.approx(
        np.array([[[2.0], [4.0]]])
    )
    # rank 1's units in turn: two at half speed (0.5 s each), then its third shares the
    # core until rank 0 is done at 2 s (0.5 of its work) and runs its last 0.5 alone
    got = shared_durations(np.array([[[1.0, 0.0, 0.0], [0.25, 0.25, 1.0]]]), 1)
    assert got[0, 1] == pytest.approx([0.5, 0.5, 1.5])
    assert got[0, 0, 0] == pytest.approx(2.0)


def test_a_real_trace_s_late_micro_batches_are_fast_because_the_cores_free_up():
    """seq-lstm's sync trace (4 ranks on 2 cores): the recorded medians by position differ by
    40%, the work's under processor sharing on 2 cores by under 3%. The model, not a fit,
    explains the position effect that biased the censored completion (issue 36)."""
    whole = read_trace(DATA / "train_sync_seq_lstm.csv")
    order = np.lexsort((whole.micro_batch, whole.worker, whole.iteration))
    x = whole.seconds[order].reshape(int(whole.iteration.max()) + 1, 4, 4)
    recorded = np.median(x, axis=(0, 1))
    shared = np.median(unshared_work(x, 2), axis=(0, 1))
    assert recorded.max() / recorded.min() > 1.3
    assert shared.max() / shared.min() < 1.03
