"""The one seeded communication-time stream (``delays.schedule.CommStream``, review D12)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.delays.test_properties import SPECS, TERMS

from tailtrain.delays import parse_delay
from tailtrain.delays.schedule import (
    COLLECTIVE_COMM_KEY,
    JOB_COMM_KEY,
    ROUND_BLOCK,
    ROUND_COMM_KEY,
    CommStream,
    JobDurations,
    RoundClock,
)
from tailtrain.errors import UsageError


class _Flat:
    """A delay source of ones: only the T^c stream varies."""

    cuttable = True

    def next_block(self, iterations: int) -> np.ndarray:
        return np.ones((iterations, 3))

    def time_factor(self, starts: np.ndarray, workers: np.ndarray) -> np.ndarray:
        return np.ones(workers.size)


@settings(max_examples=60, deadline=None)
@given(spec=TERMS, seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40))
def test_one_term_draws_do_not_depend_on_how_many_at_once(spec: str, seed: int, n: int) -> None:
    # so a consumer drawing T^c in blocks and one drawing it a value at a time see one sequence
    model = parse_delay(spec)
    bulk = CommStream(model, seed, (7,)).block(n)
    single = CommStream(model, seed, (7,))
    assert np.array_equal(bulk, [single.next() for _ in range(n)])


@settings(max_examples=60, deadline=None)
@given(spec=SPECS, seed=st.integers(0, 2**32 - 1), buffer=st.integers(1, 9), n=st.integers(1, 30))
def test_buffered_next_keeps_the_block_draw_order(spec: str, seed: int, buffer: int, n: int):
    # a sum of terms draws each term as a whole block, so its order depends on the block size:
    # next() draws `buffer` at a time, exactly the blocks a bulk consumer would draw
    model = parse_delay(spec)
    stream = CommStream(model, seed, (7,), buffer)
    blocks = CommStream(model, seed, (7,))
    expected = np.concatenate([blocks.block(buffer) for _ in range(-(-n // buffer))])[:n]
    assert np.array_equal([stream.next() for _ in range(n)], expected)


def test_a_sum_of_varying_terms_is_why_the_buffer_is_part_of_a_stream():
    model = parse_delay("exp:rate=1+exp:rate=2")
    single = CommStream(model, 0, (7,))
    assert not np.array_equal(
        CommStream(model, 0, (7,)).block(4), [single.next() for _ in range(4)]
    )


def test_consumers_keep_their_historic_streams():
    # the generators before CommStream, draw for draw: a changed key changes every record
    model = parse_delay("exp:rate=20")
    durations = JobDurations(_Flat(), 3, model, seed=5)
    got = durations.peek(np.arange(3), np.zeros(3)) - 1.0
    old = np.maximum(model.sample(np.random.default_rng((5, 12)), (256, 3)), 0.0)[0]
    assert np.allclose(got, old, rtol=0, atol=1e-15)
    clock = RoundClock(_Flat(), model, 5)
    old = np.maximum(model.sample(np.random.default_rng((5, 11)), ROUND_BLOCK), 0.0)
    assert [clock.next_comm() for _ in range(3)] == list(old[:3])
    eager = CommStream.from_spec("exp:rate=20", 5, COLLECTIVE_COMM_KEY)
    old_rng = np.random.default_rng([5, 0x636F6D6D])
    assert [eager.next() for _ in range(3)] == [
        float(model.sample(old_rng, 1)[0]) for _ in range(3)
    ]
    assert len({JOB_COMM_KEY, ROUND_COMM_KEY, COLLECTIVE_COMM_KEY}) == 3


def test_comm_stream_from_spec():
    assert CommStream.from_spec(None, 0, (1,)).next() == 0.0
    assert np.array_equal(CommStream.from_spec(None, 0, (1,)).block((2, 2)), np.zeros((2, 2)))
    assert CommStream.from_spec("0.25", 0, (1,)).next() == 0.25
    a, b = CommStream.from_spec("exp:rate=4", 3, (1,)), CommStream.from_spec("exp:rate=4", 3, (1,))
    draws = [a.next() for _ in range(5)]
    assert draws == [b.next() for _ in range(5)] and len(set(draws)) == 5
    assert CommStream.from_spec("normal:mean=0,std=1", 0, (1,)).block(500).min() == 0.0
    with pytest.raises(UsageError):
        CommStream.from_spec("-1", 0, (1,))
    with pytest.raises(UsageError):
        CommStream.from_spec("nope:x=1", 0, (1,))
