"""The virtual-time collective model (eager-SGD §4) and the Fig. 8 microbenchmark."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.errors import UsageError
from tailtrain.sim.partial.collectives import (
    Network,
    latencies,
    resolve_round,
)
from tailtrain.sim.partial.microbench import Microbenchmark, run_microbenchmark
from tailtrain.strategies.eager import Collective, majority_initiator
from tailtrain.topology.partial import activation_hops

NET = Network(hop=1e-3, allreduce=0.25)


@given(st.integers(1, 5000))
def test_activation_hops_is_ceil_log2(p):
    h = activation_hops(p)
    assert (p == 1 and h == 0) or 2 ** (h - 1) < p <= 2**h


calls_strategy = st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(calls_strategy)
def test_allreduce_waits_for_everybody(calls):
    timing = resolve_round(calls, Collective.ALLREDUCE, NET)
    assert timing.complete == pytest.approx(max(calls) + 0.25)
    assert timing.nap == len(calls)


@settings(max_examples=60, deadline=None)
@given(calls_strategy)
def test_solo_starts_at_the_first_call_and_has_an_active_process(calls):
    timing = resolve_round(calls, Collective.SOLO, NET)
    hops = activation_hops(len(calls))
    assert calls[int(timing.initiator)] == min(calls)
    assert timing.complete == pytest.approx(min(calls) + hops * 1e-3 + 0.25)
    assert timing.nap >= 1
    assert timing.active.tolist() == [c <= min(calls) + hops * 1e-3 for c in calls]


@settings(max_examples=60, deadline=None)
@given(calls_strategy, st.data())
def test_tree_quorum_activates_at_the_counter_after_k_calls_reached_it(calls, data):
    p = len(calls)
    k = data.draw(st.integers(1, p))
    r = data.draw(st.integers(0, 100))
    counter = r % p
    # the counter's own call counts at once, every other call's message takes one hop; then
    # the activation's ceil(log2 P) hops (as the runtime's counter does, tree or direct)
    start = sorted(c if q == counter else c + 1e-3 for q, c in enumerate(calls))[k - 1]
    reach = start + activation_hops(p) * 1e-3
    timing = resolve_round(calls, Collective.QUORUM, NET, k=k, counter=r)
    assert int(timing.initiator) == counter
    assert float(timing.activation) == pytest.approx(start)
    assert float(timing.complete) == pytest.approx(reach + 0.25)
    assert timing.active.tolist() == [c <= reach for c in calls]
    assert timing.nap >= k  # the K counted calls came before the activation reached them


@settings(max_examples=60, deadline=None)
@given(calls_strategy, st.data())
def test_majority_starts_at_the_designated_rank(calls, data):
    rank = data.draw(st.integers(0, len(calls) - 1))
    timing = resolve_round(calls, Collective.MAJORITY, NET, initiator=rank)
    assert timing.activation == calls[rank]
    assert bool(timing.active[rank])


def test_rounds_resolve_in_batches_like_one_by_one():
    rng = np.random.default_rng(0)
    calls = rng.exponential(size=(50, 9))
    ranks = rng.integers(9, size=50)
    batched = resolve_round(calls, Collective.MAJORITY, NET, initiator=ranks)
    for i in range(50):
        single = resolve_round(calls[i], Collective.MAJORITY, NET, initiator=ranks[i])
        assert single.complete == batched.complete[i]
        assert single.active.tolist() == batched.active[i].tolist()


def test_a_process_that_calls_after_completion_returns_at_once():
    calls = np.array([0.0, 0.1, 5.0])
    timing = resolve_round(calls, Collective.SOLO, Network(hop=0.01, allreduce=0.5))
    # activation reaches all after 2 hops; done at 0.52
    assert latencies(calls, timing).tolist() == pytest.approx([0.52, 0.42, 0.0])
    assert latencies(calls, timing, overhead=0.1)[2] == pytest.approx(0.1)


def test_errors_are_usage_errors():
    with pytest.raises(UsageError):
        resolve_round([0.0, 1.0], Collective.QUORUM, NET, k=3)
    with pytest.raises(UsageError):
        resolve_round([0.0, 1.0], Collective.MAJORITY, NET)
    with pytest.raises(UsageError):
        resolve_round([0.0, np.inf], Collective.MAJORITY, NET, initiator=1)
    with pytest.raises(UsageError):
        Network(hop=-1.0)


# --- the microbenchmark (eager-SGD Fig. 8) ---------------------------------------------------


def test_microbenchmark_matches_the_closed_form_under_linear_skew():
    p, step, hop = 32, 1e-3, 2e-6
    out = run_microbenchmark(Microbenchmark(procs=p, skew=f"linear:step={step}", hop=hop))
    allreduce = 5 * hop  # ceil(log2 32) hops, recursive doubling of a one-element buffer
    # everybody waits for rank P-1: mean of (P-1-r)·step, plus the allreduce
    assert out["allreduce"].latency == pytest.approx((p - 1) / 2 * step + allreduce)
    assert out["allreduce"].nap == p
    # solo: rank 0 waits for 5 hops and the allreduce, everybody else finds the result
    assert out["solo"].latency == pytest.approx((5 * hop + allreduce) / p)
    assert out["solo"].nap == 1
    # quorum K = 16: ranks 0..15 wait for rank 15, its call's hop to the counter (none in the
    # 2 of 64 iterations whose counter, rotating over the ranks, is rank 15 itself), 5 hops
    k = p // 2
    told = 6 * hop - hop * 2 / 64
    waited = sum((k - 1 - r) * step + told + allreduce for r in range(k)) / p
    assert out["quorum"].latency == pytest.approx(waited)
    assert out["quorum"].nap == k


def test_majority_mean_nap_is_half_the_processes_under_full_skew():
    """eager-SGD §4.2: the initiator is uniform over ranks, so E[NAP] = (P+1)/2 ≈ P/2."""
    p, n = 32, 4000
    bench = Microbenchmark(procs=p, iterations=n, seed=5)
    calls = np.broadcast_to(np.arange(p) * 1e-3, (n, p))
    ranks = [majority_initiator(bench.seed, i, p) for i in range(n)]
    naps = resolve_round(calls, Collective.MAJORITY, bench.network, initiator=ranks).nap
    assert run_microbenchmark(bench)["majority"].nap == pytest.approx(naps.mean())
    se = naps.std(ddof=1) / np.sqrt(n)
    assert abs(naps.mean() - (p + 1) / 2) <= 4 * se
    assert abs(naps.mean() - p / 2) <= 0.15 * p / 2  # the acceptance bound


def test_microbenchmark_is_deterministic_and_seeded():
    a = run_microbenchmark(Microbenchmark(iterations=16, seed=1, skew="rotating:low=0,high=0.03"))
    b = run_microbenchmark(Microbenchmark(iterations=16, seed=1, skew="rotating:low=0,high=0.03"))
    c = run_microbenchmark(Microbenchmark(iterations=16, seed=2, skew="rotating:low=0,high=0.03"))
    assert a == b
    assert a["majority"] != c["majority"]


@pytest.mark.parametrize(
    "kwargs",
    [{"procs": 0}, {"iterations": 0}, {"quorum": 33}, {"hop": -1.0}, {"overhead": float("nan")}],
)
def test_microbenchmark_rejects_bad_setups(kwargs):
    with pytest.raises(UsageError):
        Microbenchmark(**kwargs)


# --- direct activation (runtime.partial.collective's DIRECT_ACTIVATION) ----------------------


def sends_before(source: int, dest: int, procs: int) -> int:
    """1-based place of ``dest`` among the initiator's messages: it writes to every other rank
    in ascending order, itself skipped."""
    return len([p for p in range(procs) if p != source and p <= dest])


def direct_expectation(calls, source, start, hop, send):
    """Each rank's activation: the initiator at ``start``, the m-th addressee m sends and a
    hop later; active = called no later than its activation."""
    p = len(calls)
    arrival = [
        start if q == source else start + hop + sends_before(source, q, p) * send for q in range(p)
    ]
    return arrival, [c <= a for c, a in zip(calls, arrival, strict=True)]


DIRECT = Network(hop=2e-3, allreduce=0.01, direct=8, send=1e-4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 0.05, allow_nan=False), min_size=1, max_size=8))
def test_direct_solo_reaches_everyone_after_a_hop_and_the_initiators_sends(calls):
    timing = resolve_round(calls, Collective.SOLO, DIRECT)
    first = int(np.argmin(calls))
    arrival, active = direct_expectation(calls, first, min(calls), 2e-3, 1e-4)
    p = len(calls)
    reach = min(calls) + (2e-3 + (p - 1) * 1e-4 if p > 1 else 0.0)
    assert int(timing.initiator) == first
    assert float(timing.reach) == pytest.approx(reach) == pytest.approx(max(arrival))
    assert float(timing.complete) == pytest.approx(reach + 0.01)
    assert timing.active.tolist() == active


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 0.05, allow_nan=False), min_size=2, max_size=8), st.data())
def test_direct_majority_sends_from_the_designated_rank(calls, data):
    rank = data.draw(st.integers(0, len(calls) - 1))
    timing = resolve_round(calls, Collective.MAJORITY, DIRECT, initiator=rank)
    _, active = direct_expectation(calls, rank, calls[rank], 2e-3, 1e-4)
    assert float(timing.reach) == pytest.approx(calls[rank] + 2e-3 + (len(calls) - 1) * 1e-4)
    assert timing.active.tolist() == active


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 0.05, allow_nan=False), min_size=2, max_size=8), st.data())
def test_direct_quorum_activates_at_the_counter_after_k_calls_reached_it(calls, data):
    p = len(calls)
    k = data.draw(st.integers(1, p))
    r = data.draw(st.integers(0, 100))
    counter = r % p
    # every caller but the counter sends one message (a send and a hop) to the counter
    told = sorted(c if q == counter else c + 1e-4 + 2e-3 for q, c in enumerate(calls))
    start = told[k - 1]
    timing = resolve_round(calls, Collective.QUORUM, DIRECT, k=k, counter=r)
    _, active = direct_expectation(calls, counter, start, 2e-3, 1e-4)
    assert int(timing.initiator) == counter
    assert float(timing.activation) == pytest.approx(start)
    assert float(timing.reach) == pytest.approx(start + 2e-3 + (p - 1) * 1e-4)
    assert timing.active.tolist() == active
    assert timing.nap >= min(k, sum(c <= start for c in calls))


def test_direct_activation_stops_above_its_process_count_and_spares_the_allreduce():
    calls = np.arange(9) * 1e-3
    tree = resolve_round(calls, Collective.SOLO, Network(hop=2e-3, allreduce=0.01))
    assert float(resolve_round(calls, Collective.SOLO, DIRECT).reach) == float(tree.reach)
    assert float(tree.reach) == pytest.approx(4 * 2e-3)  # ceil(log2 9) hops
    sync = resolve_round(calls[:8], Collective.ALLREDUCE, DIRECT)
    assert float(sync.complete) == pytest.approx(7e-3 + 0.01)


def test_direct_rounds_resolve_in_batches_like_one_by_one():
    rng = np.random.default_rng(1)
    calls = rng.exponential(0.01, size=(40, 6))
    rounds = np.arange(40)
    batched = resolve_round(calls, Collective.QUORUM, DIRECT, k=3, counter=rounds)
    for i in range(40):
        single = resolve_round(calls[i], Collective.QUORUM, DIRECT, k=3, counter=i)
        assert single.complete == batched.complete[i]
        assert single.active.tolist() == batched.active[i].tolist()


def test_the_microbenchmark_under_direct_activation_matches_the_closed_form():
    """Linear skew 5 ms, hop 2 ms, send 0.1 ms: solo's rank 1 (5 ms) calls after the message
    reached it (2.1 ms); it is active under ceil(log2 8) = 3 hops (6 ms)."""
    p, step, hop, send, ar = 8, 5e-3, 2e-3, 1e-4, 0.01
    kw = dict(procs=p, skew=f"linear:step={step}", hop=hop, allreduce=ar, iterations=8)
    direct = run_microbenchmark(Microbenchmark(**kw, direct=8, send=send))
    assert run_microbenchmark(Microbenchmark(**kw))["solo"].nap == 2
    assert direct["solo"].nap == 1
    solo = hop + (p - 1) * send + ar  # rank 0's wait; the others wait for what is left
    waits = [max(solo - r * step, 0.0) for r in range(p)]
    assert direct["solo"].latency == pytest.approx(np.mean(waits))
    # quorum K = 4 over 8 iterations: the counter is each rank once
    k, quorum = 4, []
    for counter in range(p):
        told = sorted(r * step if r == counter else r * step + send + hop for r in range(p))
        complete = told[k - 1] + hop + (p - 1) * send + ar
        quorum += [max(complete - r * step, 0.0) for r in range(p)]
    assert direct["quorum"].latency == pytest.approx(np.mean(quorum))


def test_direct_activation_reaches_the_ranks_in_ascending_order():
    """Initiator 2 of 5, hop 2 ms, 1 ms a send: ranks 0, 1, 3, 4 hear at 3, 4, 5, 6 ms. Rank 0
    calls at 3.5 ms, after its message: waiting; rank 4 at 5.5 ms, before its own: active."""
    calls = [3.5e-3, 9e-3, 0.0, 9e-3, 5.5e-3]
    net = Network(hop=2e-3, allreduce=0.01, direct=5, send=1e-3)
    timing = resolve_round(calls, Collective.MAJORITY, net, initiator=2)
    assert timing.active.tolist() == [False, False, True, False, True]
    assert float(timing.reach) == pytest.approx(6e-3)
