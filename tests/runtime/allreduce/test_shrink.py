"""`--on-rank-loss shrink`: the allreduce goes on without a killed or hung rank (issue 26).

Each end-to-end test is one local job of logreg ranks under ``sync``; the reference is plain
SGD on the concatenated batches of the ranks each record row names ``live``, so the final
parameters check which ranks contributed to each step, and that no rank was counted twice.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.runtime import census_drill

from tailtrain.core.scenario import Scenario
from tailtrain.errors import TailtrainError, UsageError
from tailtrain.faults import FaultPlan
from tailtrain.runtime.allreduce import rounds as rounds_module
from tailtrain.runtime.allreduce.rounds import train_allreduce
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.elastic.deadline import (
    DEADLINE_FACTOR,
    LONGEST_FACTOR,
    MIN_DEADLINE,
    MIN_WINDOW,
    ROUNDS_SEEN,
    Deadline,
)
from tailtrain.runtime.elastic.refusals import check_shrink
from tailtrain.runtime.elastic.shrink import WITHDRAWN, Refused, Shrinker
from tailtrain.runtime.keep import Keeper
from tailtrain.runtime.launching.checks import validate
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.failures import JobFailed
from tailtrain.runtime.launching.launch import launch
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.dropcompute import DropCompute
from tailtrain.strategies.registry import parse_strategy
from tailtrain.tasks import parse_partition, parse_task
from tailtrain.tasks.stream import job_batches
from tailtrain.theory.dropcompute import empirical_threshold

SEED = 5
LR = 0.1


def config(
    workers: int,
    faults: list[str],
    iterations: int = 12,
    delay: str | None = None,
    strategy: str = "sync",
    **kw,
) -> TrainConfig:
    delays = {} if delay is None else {"delay": delay}
    s = Scenario(task="logreg", workers=workers, iterations=iterations, eval_every=1000, **delays)
    plan = FaultPlan.parse(faults, workers)
    return TrainConfig(
        scenario=s,
        strategy=strategy,
        seed=SEED,
        timeout=60,
        faults=plan,
        on_rank_loss="shrink",
        inject=delay is not None,
        **kw,
    )


def run(cfg: TrainConfig, entry=None):
    return launch([cfg], reserve(Endpoint("127.0.0.1", 0)), entry)


def dies_in_census(cfg: TrainConfig, comm: Collectives):
    """Rank 2 checks in to the first census, then dies before the group forms."""
    return census_drill.dies_in_census(train_allreduce, cfg, comm)


def dies_in_heal(cfg: TrainConfig, comm: Collectives):
    """Rank 1 dies (SIGKILL) as the members take a joiner in."""
    if comm.rank == 1:
        Shrinker.grow = lambda self, step, rows: os.kill(os.getpid(), signal.SIGKILL)
    return train_allreduce(cfg, comm)


#: seconds rank 0 pauses in each evaluation and checkpoint write (:func:`pauses`): longer
#: than the deadline these millisecond rounds teach (MIN_DEADLINE)
PAUSE = 1.5 * MIN_DEADLINE


def pauses(cfg: TrainConfig, comm: Collectives):
    """Rank 0 takes PAUSE seconds more in each evaluation and each checkpoint write."""
    if comm.rank == 0:
        save, score = Keeper._save, rounds_module.scorer

        def slow_save(self, snapshot):
            time.sleep(PAUSE)
            save(self, snapshot)

        def slow_scorer(run):
            scores = score(run)
            return lambda: (time.sleep(PAUSE), scores())[1]

        Keeper._save, rounds_module.scorer = slow_save, slow_scorer
    return train_allreduce(cfg, comm)


def tells_follow_world(cfg: TrainConfig, comm: Collectives):
    """Each (state, ctx, followed state) of ``DropCompute.follow_world`` on this rank, in its
    result's summary (``followed``)."""
    pure, seen = DropCompute.follow_world, []

    def follow_world(self, state, ctx):
        seen.append((state, ctx, pure(self, state, ctx)))
        return seen[-1][2]

    DropCompute.follow_world = follow_world
    result = train_allreduce(cfg, comm)
    result.record.summary["followed"] = seen
    return result


def reference(cfg: TrainConfig, steps: list[dict]) -> torch.Tensor:
    """SGD on the concatenated batches of each row's live ranks, keyed (seed, rank, step):
    of the first ``completed[n]`` of rank n's M micro-batches where rows count them
    (DropCompute's weights (C_n/M)/L, Eq. 1: the sum of their mean losses over L M)."""
    s, n = cfg.scenario, cfg.scenario.workers
    task = parse_task(s.task, seed=SEED)
    partition = parse_partition(s.partition).assign(task, n, np.random.default_rng(SEED))
    theta = task.init_params(SEED)
    for row in steps:
        live = np.asarray(row["live"])
        m = row.get("micro_batches") or 1
        batches = job_batches(
            partition, SEED, task.batch_size, live, np.full(len(live), row["step"]), m
        )
        # a round of shares (rebalance) deals the live ranks' L M micro-batches, all counted
        done = [m] * len(live) if "shares" in row else row.get("completed") or [m] * len(live)
        model = task.module_at(theta)
        loss = sum(
            F.cross_entropy(model(task.data.x_train[b]), task.data.y_train[b])
            for k, c in zip(range(len(live)), done, strict=True)
            for b in batches[k, : int(c)]
        ) / (len(live) * m)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        theta = theta - LR * torch.cat([g.reshape(-1) for g in grads])
    return theta


def check_run(cfg: TrainConfig, by_rank, survivors: list[int]) -> list[dict]:
    steps = by_rank[0][0].record.steps
    assert [r["step"] for r in steps] == list(range(cfg.scenario.iterations))
    assert sorted(steps[-1]["live"]) == survivors
    want = reference(cfg, steps).numpy()
    for rank in survivors:
        np.testing.assert_allclose(by_rank[rank][0].theta, want, rtol=1e-4, atol=1e-5)
    for rank in set(range(cfg.scenario.workers)) - set(survivors):
        assert {"dead", "left"} & set(by_rank[rank][0].record.summary)
    return steps


# ---- no process: the refusals and the deadline -------------------------------------------------
def test_a_rule_that_cannot_follow_a_smaller_world_refuses_shrink_in_one_line():
    check_shrink(parse_strategy("dropcompute:threshold=auto"), "allreduce", local=True)
    check_shrink(parse_strategy("dropcompute:drop-rate=0.1"), "allreduce", local=True)
    with pytest.raises(UsageError, match="larger-batch sizes every rank's batch"):
        larger = "dropcompute:threshold=0.2,compensate=larger-batch"
        check_shrink(parse_strategy(larger), "allreduce", local=True)
    check_shrink(parse_strategy("rebalance:then=dropcompute"), "allreduce", local=True)
    with pytest.raises(UsageError, match=r"^--on-rank-loss shrink: 'rebalance.*defer=true"):
        deferred = "rebalance:then=dropcompute,defer=true"
        check_shrink(parse_strategy(deferred), "allreduce", local=True)
    check_shrink(parse_strategy("rebalance:deal=demand"), "allreduce", local=True)
    with pytest.raises(UsageError, match="allreduce and partial-collective topologies"):
        check_shrink(parse_strategy("lgc:k=2"), "parameter-server", local=True)
    with pytest.raises(UsageError, match="torchrun"):
        check_shrink(parse_strategy("sync"), "allreduce", local=False)
    check_shrink(parse_strategy("sync"), "allreduce", local=True)
    check_shrink(parse_strategy("dropcompute:threshold=0.3"), "allreduce", local=True)
    check_shrink(parse_strategy("local-sgd:period=2"), "allreduce", local=True)
    with pytest.raises(UsageError, match="cannot follow a smaller world"):
        s = Scenario(task="logreg", workers=2, iterations=2, micro_batches=2)
        larger = "dropcompute:threshold=auto,compensate=larger-batch"
        validate(TrainConfig(s, larger, on_rank_loss="shrink"), local=True)
    with pytest.raises(UsageError, match="--on-rank-loss"):
        TrainConfig(Scenario(task="logreg", workers=2, iterations=2), "sync", on_rank_loss="grow")


def test_the_deadline_is_learned_from_the_recent_rounds_within_the_timeout():
    d = Deadline(timeout=30.0)
    assert d.bound == 30.0 and "--timeout" in d.describe()  # nothing measured yet
    d.seen(0.01)
    assert d.bound == MIN_DEADLINE < 2.0
    d.seen(0.5)
    d.seen(math.nan)
    assert d.bound == max(MIN_DEADLINE, LONGEST_FACTOR * 0.5) and "0.500 s" in d.describe()
    d.seen(2.0)
    assert d.bound == LONGEST_FACTOR * 2.0  # the longest round seen never trips it
    d.seen(30.0)
    assert d.bound == 30.0
    assert d.window <= d.bound
    # a burst of load on a few rounds moves the quantile not, and the longest only by 1.5 x
    d = Deadline(timeout=30.0)
    for seconds in [0.3] * 95 + [1.0] * 5:
        d.seen(seconds)
    assert d.quantile == 0.3 and d.bound == pytest.approx(max(5 * 0.3, LONGEST_FACTOR * 1.0))
    assert d.window == pytest.approx(max(MIN_WINDOW, 1.5 * 1.0))
    # they age out: the deadline follows the last ROUNDS_SEEN rounds
    for _ in range(ROUNDS_SEEN):
        d.seen(0.3)
    assert d.bound == pytest.approx(max(MIN_DEADLINE, DEADLINE_FACTOR * 0.3))
    other = Deadline(timeout=30.0)
    other.adopt(list(d.recent))
    assert (other.bound, other.longest, other.quantile) == (d.bound, d.longest, d.quantile)


def test_a_join_request_a_break_overtook_is_seen_again_and_a_refused_one_is_withdrawn():
    store = torch.distributed.HashStore()
    lowest = Shrinker(0, store, Deadline(timeout=5.0), torch.device("cpu"), [0, 1], world=3)

    def look() -> bool:
        lowest.next_look = 0.0  # JOIN_LOOK's rate limit is no part of the answer
        return lowest.joins_waiting()

    store.set("join/1", json.dumps([4, 4]))  # a member's own (it died and came back): not yet
    assert not look()
    store.set("join/2", json.dumps([3, 3]))
    assert look() and not lowest.joins_waiting()  # at most every JOIN_LOOK seconds
    # the round that carries the grow breaks first; rank 1 is lost by the census, and the
    # next generation still sees both requests, which no counter rise announces again
    lowest.members = [0]
    assert look() and look()
    taken = lowest.grow(step=5, rows=5)
    assert taken.members == [0, 1, 2] and taken.joined == [1, 2]
    assert not store.check(["join/2"]) and not look()
    # a joiner the run ended for withdraws its request: no later grow waits for it
    store = lowest.store = torch.distributed.HashStore()
    joiner = Shrinker(2, store, Deadline(timeout=5.0), torch.device("cpu"), [0], world=3)
    lowest.members = [0]
    store.set("finished", "1")
    with pytest.raises(Refused):
        joiner.join(step=6, rows=6)
    # written withdrawn, not deleted: the lowest member never reads a key gone under it
    assert store.get("join/2").decode() == WITHDRAWN and not look()


def test_a_census_that_lost_rank_0_goes_on_where_no_rank_is_kept_and_a_late_rank_leaves():
    """``keeper=None`` (``integrate.StragglerStep`` under ``tailtrain launch``): rank 0, noted
    dead by the launcher, is lost like any rank; with ``heals=False`` a rank that came after the
    census is refused at once, leaving ``left/{rank}`` for the launcher and no join request."""
    store = torch.distributed.HashStore()
    members = [0, 1, 2]
    one = Shrinker(1, store, Deadline(timeout=5.0), torch.device("cpu"), members, world=3)
    one.keeper, one.heals = None, False
    store.set("dead/0", "killed by SIGKILL")
    store.set("gen0/in/2", json.dumps([7, 0]))
    found = one.census(step=7, rows=0)
    assert (found.members, found.dead, found.steps) == ([1, 2], [0], {1: 7, 2: 7})
    # the same census where rank 0 keeps the record (train) ends the job in one line
    kept = Shrinker(2, torch.distributed.HashStore(), Deadline(timeout=5.0), torch.device("cpu"),
                    list(members), world=3)  # fmt: skip
    kept.store.set("dead/0", "killed by SIGKILL")
    kept.store.set("gen0/in/1", json.dumps([7, 0]))
    with pytest.raises(TailtrainError, match="rank 0, which keeps the record"):
        kept.census(step=7, rows=0)
    late = Shrinker(0, store, Deadline(timeout=5.0), torch.device("cpu"), members, world=3)
    late.keeper, late.heals = None, False
    with pytest.raises(Refused, match="takes no rank back"):
        late.census(step=7, rows=0)  # generation 0's members are written: it is not one
    assert store.check(["left/0"]) and not store.check(["join/0"])


def test_a_census_holds_when_a_rank_that_began_closing_it_died_before_writing_the_members():
    """Closing is no elected role: a rank that began closing the census and died before it
    wrote the members (here its mark, as the former ``store.add`` election left it) leaves
    the others the list they write themselves, not a wait that times out."""
    store = torch.distributed.HashStore()
    store.add("gen0/closer", 1)  # rank 0 began closing, and died
    store.set("dead/0", "killed by SIGKILL")
    store.set("gen0/in/2", json.dumps([7, 0]))
    one = Shrinker(1, store, Deadline(timeout=1.0), torch.device("cpu"), [0, 1, 2], world=3)
    one.keeper = None
    found = one.census(step=7, rows=0)
    assert (found.members, found.dead) == ([1, 2], [0])
    two = Shrinker(2, store, Deadline(timeout=1.0), torch.device("cpu"), [0, 1, 2], world=3)
    two.keeper = None
    assert two.census(step=7, rows=0).members == [1, 2]  # the list that stands


def test_a_joiner_that_died_waiting_is_not_taken_in_and_its_request_is_cleared():
    """A joiner killed while it waits leaves ``join/2``; the shield sets ``dead/2``. No grow is
    asked for it and none takes it in (its forming would fail once, before a census), and its
    key is cleared; a live joiner beside it is taken in; started again, it asks anew."""
    store = torch.distributed.HashStore()
    lowest = Shrinker(0, store, Deadline(timeout=5.0), torch.device("cpu"), [0], world=4)
    store.set("join/2", json.dumps([3, 3]))
    store.set("dead/2", "killed")
    assert not lowest.joins_waiting()
    assert not store.check(["join/2"])
    store.set("join/2", json.dumps([3, 3]))  # asked again before the look: still stale
    store.set("join/3", json.dumps([4, 4]))
    lowest.next_look = 0.0
    assert lowest.joins_waiting()
    taken = lowest.grow(step=5, rows=5)
    assert taken.members == [0, 3] and taken.joined == [3]
    assert not store.check(["join/2"]) and not store.check(["join/3"])
    # started again, rank 2 withdraws its dead/ key before it asks: taken in at the next grow
    joiner = Shrinker(2, store, Deadline(timeout=0.05), torch.device("cpu"), [0, 3], world=4)
    with pytest.raises(Refused):  # nobody grows in its 50 ms: it withdraws once more
        joiner.join(step=6, rows=6)
    assert not store.check(["dead/2"])
    store.set("join/2", json.dumps([6, 6]))  # as join() asks, without the wait
    lowest.members, lowest.generation = [0, 3], 1
    assert lowest.asking() == [2]


def test_a_rank_started_again_that_no_one_takes_in_fails_its_heal_and_a_heal_is_said_once_held():
    """A rank started again (``rejoining``) whose --timeout passes with no grow taking it in
    fails (a heal that failed is a failure: its launcher says so), withdrawn; one that woke
    after a census is refused as before. A joiner takes the lowest member's rounds seen, so its
    forming waits the live ranks' deadline, not --timeout; ``held`` says the generation held
    and, in a rank taken in, ``healed/{rank}`` (the step it goes on from)."""
    store = torch.distributed.HashStore()
    joiner = Shrinker(2, store, Deadline(timeout=0.05), torch.device("cpu"), [0], world=3)
    joiner.rejoining = True
    with pytest.raises(TailtrainError, match=r"none took it in within --timeout 0\.05s: the heal"):
        joiner.join(step=0, rows=0)
    assert store.get("join/2").decode() == WITHDRAWN and not store.check(["left/2"])
    store.set("finished", "1")  # the run's end first: refused, as a woken rank is
    with pytest.raises(Refused):
        joiner.join(step=0, rows=0)
    store = torch.distributed.HashStore()
    lowest = Shrinker(0, store, Deadline(timeout=300.0), torch.device("cpu"), [0], world=2)
    for seconds in (0.1, 0.3, 0.2):
        lowest.deadline.seen(seconds)
    store.set("join/1", json.dumps([0, 0, []]))
    taken = lowest.grow(step=7, rows=7)
    back = Shrinker(1, store, Deadline(timeout=300.0), torch.device("cpu"), [], world=2)
    back.rejoining = True
    found = back.join(step=0, rows=0)
    assert found.members == [0, 1] and back.deadline.bound == lowest.deadline.bound == 1.0
    assert not store.check(["healed/1"])  # taken in, not yet held: nothing said
    back.generation, found.joined = 1, taken.joined
    back.held(found)
    assert json.loads(store.get("healed/1")) == [1, 7]
    assert json.loads(store.get("gen1/held")) == {
        "members": [0, 1],
        "step": 7,
        "lost": [],
        "joined": [1],
    }


# ---- real processes ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_killed_ranks_leave_a_run_that_shrinks_to_one_rank_and_matches_the_record():
    # rank 2 dies at step 3, rank 1 at step 7: 3 ranks, then 2, then 1
    cfg = config(3, ["kill:worker=2,step=3", "kill:worker=1,step=7"])
    by_rank = run(cfg)
    steps = check_run(cfg, by_rank, [0])
    lives = [tuple(r["live"]) for r in steps]
    assert lives == [(0, 1, 2)] * 3 + [(0, 1)] * 4 + [(0,)] * 5
    assert [r["dead"] for r in steps if r["dead"]] == [[2], [1]]
    batch = parse_task("logreg", seed=SEED).batch_size
    assert [r["skipped"] for r in steps] == [0] * 3 + [batch] * 4 + [2 * batch] * 5
    generations = by_rank[0][0].record.summary["generations"]
    assert [g[:3] for g in generations] == [[1, 3, [2]], [2, 7, [1]]]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_two_ranks_dying_together_leave_one_generation_without_both():
    cfg = config(4, ["kill:worker=2,step=4", "kill:worker=3,step=4"], iterations=8)
    by_rank = run(cfg)
    steps = check_run(cfg, by_rank, [0, 1])
    assert [tuple(r["live"]) for r in steps] == [(0, 1, 2, 3)] * 4 + [(0, 1)] * 4


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_hung_rank_that_wakes_after_the_run_is_refused_and_counts_nowhere():
    # the freeze (8 s) outlasts the learned deadline (MIN_DEADLINE: these rounds take ms) and
    # the run: the rank that wakes finds it over
    cfg = config(3, ["freeze:worker=2,step=4,seconds=8"], iterations=30)
    by_rank = run(cfg)
    steps = check_run(cfg, by_rank, [0, 1])
    assert [tuple(r["live"]) for r in steps[:4]] == [(0, 1, 2)] * 4
    assert {tuple(r["live"]) for r in steps[4:]} == {(0, 1)}
    # it left alive: the shield says so, and tells nobody it died
    assert Refused.__name__ in by_rank[2][0].record.summary["left"]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_killed_rank_0_stops_the_job_with_a_line_that_says_what_to_do():
    with pytest.raises(
        JobFailed, match=r"^rank 0 .*shrink goes on without any rank but 0.*--max-restarts 1"
    ):
        run(config(2, ["kill:worker=0,step=2"]))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_hung_rank_that_wakes_rejoins_healed_from_a_live_peer():
    # 50 ms rounds: the deadline is MIN_DEADLINE (2 s); rank 2 hangs 3 s from step 4, is
    # dropped, wakes, asks to join and is taken in at a step boundary with the others' state
    cfg = config(3, ["freeze:worker=2,step=4,seconds=3"], iterations=90, delay="const:value=0.05")
    by_rank = run(cfg)
    steps = check_run(cfg, by_rank, [0, 1, 2])  # the healed rank ends equal to the others
    lives = [tuple(r["live"]) for r in steps]
    back = next(i for i, r in enumerate(steps) if r["rejoined"])
    assert steps[back]["rejoined"] == [2]
    assert lives[:4] == [(0, 1, 2)] * 4
    assert set(lives[4:back]) == {(0, 1)} and back > 4
    assert set(lives[back:]) == {(0, 1, 2)}
    assert [g[2:4] for g in by_rank[0][0].record.summary["generations"]] == [[[2], []], [[], [2]]]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_killed_rank_started_again_rejoins_healed_from_a_live_peer():
    cfg = config(
        3,
        ["kill:worker=2,step=4"],
        iterations=80,
        delay="const:value=0.1",  # 8 s of rounds: time for a new process to start and join
        restart_lost=1,
    )
    by_rank = run(cfg)
    steps = check_run(cfg, by_rank, [0, 1, 2])  # started again, it ends equal to the others
    back = next(i for i, r in enumerate(steps) if r["rejoined"])
    assert steps[4]["dead"] == [2] and back > 4 and steps[back]["rejoined"] == [2]
    assert {tuple(r["live"]) for r in steps[back:]} == {(0, 1, 2)}


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_death_during_the_census_breaks_the_new_generation_and_the_next_holds():
    # rank 3 is killed at step 4; rank 2 checks in to that census and dies before forming
    cfg = config(4, ["kill:worker=3,step=4"], iterations=10)
    by_rank = run(cfg, dies_in_census)
    steps = check_run(cfg, by_rank, [0, 1])
    assert [tuple(r["live"]) for r in steps] == [(0, 1, 2, 3)] * 4 + [(0, 1)] * 6
    assert steps[4]["dead"] == [2, 3]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_death_during_a_heal_leaves_the_joiner_and_the_other_members():
    # rank 2 hangs and is dropped; as it is taken in again, rank 1 dies
    cfg = config(3, ["freeze:worker=2,step=4,seconds=3"], iterations=90, delay="const:value=0.05")
    by_rank = run(cfg, dies_in_heal)
    steps = check_run(cfg, by_rank, [0, 2])
    back = next(i for i, r in enumerate(steps) if r["rejoined"])
    assert steps[back]["rejoined"] == [2] and steps[back]["dead"] == [1]
    assert {tuple(r["live"]) for r in steps[back:]} == {(0, 2)}


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_fixed_dropcompute_divides_by_the_live_world():
    # divide-by=m weighs C_n/M over N (Eq. 1): N must become the live ranks, or the smaller
    # world's steps would shrink by (N-1)/N; with tau = inf nothing drops, so it is sync's SGD
    cfg = config(3, ["kill:worker=1,step=3"], iterations=8, strategy="dropcompute:threshold=inf")
    by_rank = run(cfg)
    steps = check_run(cfg, by_rank, [0, 2])
    assert [tuple(r["live"]) for r in steps] == [(0, 1, 2)] * 3 + [(0, 2)] * 5


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_calibrated_dropcompute_chooses_tau_again_for_the_live_ranks():
    # Algorithm 2 over 3 calibration rounds of 3 ranks; rank 1 is killed at step 5, and tau*
    # is chosen again on the two live ranks' samples (strategies.dropcompute.follow_world)
    cfg = config(
        3,
        ["kill:worker=1,step=5"],
        iterations=9,
        delay="uniform:low=0.01,high=0.05",
        strategy="dropcompute:threshold=auto,calibrate=3",
    )
    cfg = dataclasses.replace(cfg, scenario=dataclasses.replace(cfg.scenario, micro_batches=3))
    by_rank = run(cfg, tells_follow_world)
    steps = check_run(cfg, by_rank, [0, 2])  # the counted micro-batches of the live ranks
    assert [tuple(r["live"]) for r in steps] == [(0, 1, 2)] * 5 + [(0, 2)] * 4
    [(state, ctx, after)] = by_rank[0][0].record.summary["followed"]
    assert ctx.live == (0, 2) and state.sample_ranks == (0, 1, 2)
    whole = empirical_threshold(state.samples, state.sample_comm).threshold
    live = empirical_threshold(state.samples[:, [0, 2]], state.sample_comm).threshold
    assert [r["threshold"] for r in steps[:3]] == [math.inf] * 3
    assert {r["threshold"] for r in steps[3:5]} == {whole}  # the samples calibration used
    assert after.tau == live and {r["threshold"] for r in steps[5:]} == {live}


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_rank_0s_evaluations_and_checkpoint_writes_longer_than_the_deadline_shrink_nothing(
    tmp_path,
):
    # millisecond rounds teach the floor MIN_DEADLINE; rank 0 pauses PAUSE > it in each
    # evaluation (every 5 rounds) and checkpoint write (every 4): the others wait for those
    # up to --timeout, and the rounds that hold a write are left out of the rounds seen
    (tmp_path / "run").mkdir()
    cfg = config(3, [], iterations=10, out=tmp_path / "run", checkpoint_every=4)
    cfg = dataclasses.replace(cfg, scenario=dataclasses.replace(cfg.scenario, eval_every=5))
    by_rank = run(cfg, pauses)
    steps = check_run(cfg, by_rank, [0, 1, 2])
    assert {tuple(r["live"]) for r in steps} == {(0, 1, 2)}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["generations"] == [] and summary["hang_deadline"] < PAUSE
    assert "at the end" in summary["hang_deadline_learned"]
    assert len(by_rank[0][0].record.evals) >= 2


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_rebalanced_shares_are_dealt_again_over_the_live_ranks():
    # a persistent 3x straggler moves the shares after the warm-up; rank 1 is killed at step
    # 6, and the live ranks' L M micro-batches are dealt again: no sample of theirs is lost,
    # none of the dead rank's is used (the reference: sync's SGD on the live ranks' batches)
    cfg = config(
        3,
        ["kill:worker=1,step=6"],
        iterations=10,
        delay="const:value=0.01",
        strategy="rebalance:warmup=2,window=4",
    )
    scenario = dataclasses.replace(
        cfg.scenario, micro_batches=4, pattern="slowdown:at=0,fraction=0.34,factor=3"
    )
    cfg = dataclasses.replace(cfg, scenario=scenario)
    steps = check_run(cfg, run(cfg), [0, 2])
    assert [tuple(r["live"]) for r in steps] == [(0, 1, 2)] * 6 + [(0, 2)] * 4
    assert {sum(r["shares"]) for r in steps[:6]} == {12}
    assert {(len(r["shares"]), sum(r["shares"])) for r in steps[6:]} == {(2, 8)}
    assert any(len(set(r["shares"])) > 1 for r in steps)  # the straggler's share moved
