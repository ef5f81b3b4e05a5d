"""Partial collectives on real gloo processes (``runtime.partial.collective``) and the eager
topology.

Each launch costs about a second here, so one launch runs several rounds with hand-made plans
and sleeps. The references are written from eager-SGD's definitions: a round where everybody
is active is a plain allreduce (``dist.all_reduce``); a solo round is started by the first
caller; a process that misses a round contributes its gradient through its send buffer later.
Sleeps only order events (a sleeper's call comes long after a round); nothing asserts a time.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tailtrain.core.scenario import Scenario
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.launch import launch
from tailtrain.runtime.launching.local import join_gloo, run_local
from tailtrain.runtime.partial.collective import (
    DIRECT_ACTIVATION,
    CallKind,
    CollectiveFailed,
    CollectiveTimeout,
    PartialCollective,
    RoundState,
    _Shared,
    partners,
)
from tailtrain.runtime.partial.wire import row
from tailtrain.sim.run import simulate
from tailtrain.strategies.eager import Collective, RoundPlan, majority_initiator
from tailtrain.strategies.registry import parse_strategy
from tailtrain.topology import partial
from tailtrain.topology.partial import activation_hops

pytestmark = pytest.mark.timeout(90)
SLEEP = 1.0  # a sleeper's call comes this long after the fast processes' round
TIMEOUT = 30.0


def grad_of(rank: int, r: int) -> torch.Tensor:
    """Distinct, exactly summable gradients: rank p's gradient of round r."""
    return torch.tensor([100.0 * rank + r + 1, 1.0], dtype=torch.float64)


def run_plans(plans, sleeps, hop_delay=0.0, fences=()):
    """Every rank calls rounds 0..R-1 with ``plans``; rank p sleeps ``sleeps[r][p]`` first.
    After its call of a round in ``fences`` every main thread meets the others on the default
    group (outside the collective's groups), so no rank's next round can run before every
    rank has its result (on 2 loaded cores a woken thread may otherwise find a later round).
    Returns per rank: outcomes (kind, called, adopted round), every round's result, a plain
    allreduce of round 0's gradients."""
    rank, procs = join_gloo(TIMEOUT)
    results = {}

    def after(result):
        results[result.index] = (
            result.total.tolist(),
            result.rows.tolist(),
            result.initiators.tolist(),
        )
        return plans[result.index + 1] if result.index + 1 < len(plans) else None

    coll = PartialCollective(rank, procs, 2, plans[0], after, timeout=TIMEOUT, hop_delay=hop_delay)
    plain = grad_of(rank, 0).clone()
    dist.all_reduce(plain)
    outcomes, step = [], 0
    while coll.plan(step) is not None:
        time.sleep(sleeps[step][rank] if step < len(sleeps) else 0.0)
        out = coll.call(step, grad_of(rank, step), row(step, step, 0.0, 0.0, 0.0, 0.0))
        outcomes.append((out.kind, out.called, out.result.index))
        if out.called in fences:
            dist.barrier()
        step = out.result.index + 1
    coll.close()
    dist.destroy_process_group()
    return outcomes, results, plain.tolist()


def launch_plans(procs, plans, sleeps, hop_delay=0.0, fences=()):
    return run_local(_entry, (plans, sleeps, hop_delay, fences), procs, TIMEOUT)


def _entry(arg):
    return run_plans(*arg)


def total_of(rows, rounds_grad=grad_of):
    """The sum a round must give: each contributed (worker, version) gradient once."""
    return sum(rounds_grad(int(w), int(v)) for w, _, v, *_ in rows).tolist()


# ---- the collective ------------------------------------------------------------------------
def test_activation_reaches_everyone_within_log2_hops():
    """From any initiator, for any P (an independent BFS): the initiator sends to its partners,
    every process it reaches forwards to its own."""
    for procs in range(1, 20):
        for start in range(procs):
            seen, frontier, hops = {start}, {start}, 0
            while len(seen) < procs:
                first = hops == 0
                frontier = {q for p in frontier for q in partners(p, procs, first)} - seen
                seen |= frontier
                hops += 1
            assert hops <= activation_hops(procs)
            if 1 < procs <= DIRECT_ACTIVATION:
                assert hops == 1


def test_all_active_equals_allreduce_and_a_solo_round_leaves_sleepers_behind():
    p = 4
    everyone = RoundPlan(k=p, collective=Collective.QUORUM)  # K = P: all are active
    solo = RoundPlan(k=1, collective=Collective.SOLO)
    sync = RoundPlan(k=p)
    plans = [everyone, solo, sync]
    sleeps = [[0.0] * p, [0.0] + [SLEEP] * (p - 1), [0.0] * p]
    by_rank = launch_plans(p, plans, sleeps, fences=(0,))
    _, results, plain = by_rank[0]
    # round 0: everybody active, the sum of all gradients: a plain allreduce
    assert all(by_rank[rank][0][0] == ("active", 0, 0) for rank in range(p))
    total, rows, _ = results[0]
    assert total == pytest.approx(plain)
    assert sorted(int(r[0]) for r in rows) == list(range(p))
    # round 1: rank 0 alone; it returned while the others slept, so they came late
    total, rows, initiators = results[1]
    assert list(initiators) == [0]
    assert [(int(w), int(v)) for w, _, v, *_ in rows] == [(0, 1)]
    assert total == grad_of(0, 1).tolist()
    for rank in range(1, p):
        assert by_rank[rank][0][1] == ("late", 1, 1)
    # round 2 (synchronous): the sleepers' round-1 gradients arrive through their buffers
    total, rows, _ = results[2]
    assert sorted((int(w), int(v)) for w, _, v, *_ in rows) == sorted(
        [(w, 2) for w in range(p)] + [(w, 1) for w in range(1, p)]
    )
    assert total == pytest.approx(total_of(rows))
    for rank in range(p):
        assert by_rank[rank][1] == by_rank[0][1]  # every rank saw the same rounds


def test_two_simultaneous_initiators_run_one_round():
    """Ranks 0 and 2 call at once; each activation hop waits 0.3 s, so both initiate before
    either hears the other; the round runs once and counts each gradient once."""
    p = 4
    solo = RoundPlan(k=1, collective=Collective.SOLO)
    sleeps = [[0.0, SLEEP * 2, 0.0, SLEEP * 2], [0.0] * p]
    by_rank = launch_plans(p, [solo, RoundPlan(k=p)], sleeps, hop_delay=0.3)
    _, results, _ = by_rank[0]
    assert sorted(results) == [0, 1]
    total, rows, initiators = results[0]
    assert list(initiators) == [0, 2]
    assert sorted(int(r[0]) for r in rows) == [0, 2]
    assert total == pytest.approx((grad_of(0, 0) + grad_of(2, 0)).tolist())
    assert [o[:2] for o in by_rank[1][0]] == [("late", 0), ("active", 1)]


@pytest.mark.parametrize("procs", [3, 5, 6])
def test_any_number_of_processes(procs):
    plans = [
        RoundPlan(k=1, collective=Collective.SOLO),
        RoundPlan(k=1, collective=Collective.MAJORITY, initiator=majority_initiator(0, 1, procs)),
        RoundPlan(k=2, collective=Collective.QUORUM),
        RoundPlan(k=procs),
    ]
    rng = np.random.default_rng(procs)
    sleeps = (rng.random((len(plans), procs)) * 0.05).tolist()
    by_rank = launch_plans(procs, plans, sleeps)
    _, results, _ = by_rank[0]
    assert sorted(results) == list(range(len(plans)))
    for r, (total, rows, _) in results.items():
        assert total == pytest.approx(total_of(rows))
        for rank in range(procs):
            assert by_rank[rank][1][r][0] == total
    # after the synchronous round nothing is left in any buffer: every gradient arrived once
    made = {(rank, int(v)) for rank in range(procs) for _, v, _ in by_rank[rank][0]}
    got = [(int(w), int(v)) for _, rows, _ in results.values() for w, _, v, *_ in rows]
    assert sorted(got) == sorted(made)


# ---- the training topology -----------------------------------------------------------------
P = 4
SEED = 3


def test_the_staleness_bound_forces_a_synchronous_round():
    bound = Scenario(task="logreg", workers=P, eval_every=100, iterations=6)
    config = TrainConfig(bound, "eager:mode=solo,staleness-bound=3", seed=SEED, timeout=60)
    rows = launch([config], reserve(Endpoint("127.0.0.1", 0)))[0][0].record.steps
    assert [r["collective"] for r in rows] == ["solo", "solo", "allreduce"] * 2
    assert all(r["nap"] == P for r in rows if r["collective"] == "allreduce")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_majority_decides_as_simulated_at_8_workers():
    """Injected delays 40 ms apart (20 + 40 p ms) and a 0.35 s allreduce, 70 ms longer than
    their spread: everyone calls before the round completes and restarts at its result, so
    every call is >= 40 ms from the activation, more than the real collective's jitter on a
    busy machine (an activation hop is ms; a late process's phase would drift by them). The
    initiator and the active set of >= 95% of rounds are the simulator's; the decisions vary
    (NAP follows the drawn initiator), so a wrong initiator or active rule fails."""
    scenario = Scenario(
        task="logreg",
        workers=8,
        eval_every=100,
        iterations=48,
        delay="const:value=0.02",
        pattern="linear:step=0.04",
        comm_time="0.35",
        network=f"direct={DIRECT_ACTIVATION}",  # the runtime's activation (simulate: a tree)
    )
    text = "eager:mode=majority"
    config = TrainConfig(scenario, text, seed=SEED, inject=True, timeout=60)
    real = launch([config], reserve(Endpoint("127.0.0.1", 0)))[0][0].record.steps
    sim = simulate(scenario, parse_strategy(text), SEED).steps
    decisions = []
    for a, b in zip(real, sim, strict=True):
        fresh = sorted(w for w, s in zip(b["workers"], b["staleness"], strict=True) if s == 0)
        decisions.append(((a["initiator"], sorted(a["active"])), (b["initiator"], fresh)))
    assert sum(x == y for x, y in decisions) >= 0.95 * len(sim)
    assert len({len(y[1]) for _, y in decisions}) >= 4
    # one row function (topology.partial.round_row): only the declared columns differ
    assert all(set(b) == {*partial.ROW, *partial.SIMULATED_ONLY} for b in sim)
    assert all(set(a) == {*partial.ROW, *partial.MEASURED_ONLY} for a in real)


def test_abort_after_a_failed_close_still_tells_the_peers():
    """close() marks the collective closing before it can fail (a reducer error, a timeout);
    the abort that follows must still send ABORT, once, or the peers' receivers keep waiting."""
    import sys
    import threading

    from tailtrain.runtime.partial import collective as module

    coll = object.__new__(PartialCollective)
    coll.cond, coll.procs, coll.threads = threading.Condition(), 3, ()
    coll.state = module._Shared(closing=True)  # as a close() that raised leaves it
    coll._aborted, coll._switch = False, sys.getswitchinterval()
    sent = []
    coll._send = lambda peers, kind, r: sent.append((tuple(peers), kind))
    assert coll.abort() and coll.abort()
    assert sent == [((0,), module.ABORT), ((1,), module.ABORT), ((2,), module.ABORT)]


def test_a_peer_lost_while_closing_fails_as_the_collective_and_the_joins_take_the_deadline():
    """close() meets gloo's RuntimeError when a peer died (its barrier, its last sends): a
    shrinking survivor must see CollectiveFailed, which sends it to the census, and wait for
    its threads at most the learned deadline, not --timeout."""
    import sys
    import threading

    from tailtrain.runtime.partial import collective as module

    class Thread:
        def __init__(self) -> None:
            self.waited: list[float] = []

        def join(self, timeout: float) -> None:
            self.waited.append(timeout)

        def is_alive(self) -> bool:
            return False

    class Work:
        def wait(self) -> None:
            raise RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer")

    class Done:
        def wait(self) -> None:
            pass

    class Group:
        def __init__(self, barrier: type) -> None:
            self.barrier = barrier

        def allreduce(self, tensors):
            return self.barrier()

        def send(self, tensors, peer, tag):
            return Work()

    def closing(barrier_fails: bool) -> tuple[PartialCollective, Thread]:
        coll = object.__new__(PartialCollective)
        coll.cond, coll.procs, coll.rank, coll.timeout = threading.Condition(), 2, 0, 300.0
        coll.threads, coll.state = (Thread(), Thread()), module._Shared()
        coll.send_lock, coll.pending, coll.sent = threading.Lock(), module.deque(), np.zeros(2)
        coll._switch, coll.device, coll.bound = sys.getswitchinterval(), torch.device("cpu"), None
        coll.act_group = coll.red_group = Group(Work if barrier_fails else Done)
        return coll, coll.threads[1]

    coll, reducer = closing(barrier_fails=True)
    coll.bound = lambda: 2.5
    with pytest.raises(CollectiveFailed, match=r"closing failed.*Connection closed"):
        coll.close()
    assert reducer.waited == [2.5]
    coll, reducer = closing(barrier_fails=False)  # the barrier held; a last send's wait fails
    with pytest.raises(CollectiveFailed, match="closing failed"):
        coll.close()
    assert reducer.waited == [300.0]


def test_gloos_own_timeout_in_a_data_phase_reads_as_the_waits_timeout_and_other_errors_do_not():
    """The groups' timeout and the condition waits' deadline are one ``timeout``; on a loaded
    machine either fires first, so a gloo timeout must read as the same CollectiveTimeout
    (the hang drill's one line), while a closed connection stays a CollectiveFailed."""
    coll = object.__new__(PartialCollective)
    coll.rank, coll.timeout, coll.state = 2, 1.0, _Shared()
    coll.state.error = RuntimeError(
        "[/x/gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 1000ms for send"
        " operation to complete"
    )
    error = coll._failed()
    assert isinstance(error, CollectiveTimeout) and error.__cause__ is coll.state.error
    assert str(error).startswith("rank 2: waited 1s on a peer in a send, receive or reduction")
    assert "(gloo: Timed out waiting 1000ms for send operation to complete)" in str(error)
    coll.state.error = RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer")
    assert isinstance(coll._failed(), CollectiveFailed)
    coll.state.error = ValueError("Timed out, said a user's hook")  # not gloo's RuntimeError
    assert isinstance(coll._failed(), CollectiveFailed)


# ---- states as types (issue 22) ---------------------------------------------------------------
def test_a_rounds_state_follows_the_shared_fields():
    s = _Shared(plans={0: None, 1: None, 2: None}, activated={0: 0.1, 1: 0.2}, latest=0)
    states = [s.round_state(r) for r in range(4)]
    assert states == [
        RoundState.REDUCED,
        RoundState.ACTIVATED,
        RoundState.PLANNED,
        RoundState.UNPLANNED,
    ]


def test_call_kinds_keep_their_reported_strings():
    assert [k.value for k in CallKind] == ["late", "waiting", "active"]
    assert CallKind.LATE == "late"  # a report's "kind" compares as before
