"""`--on-rank-loss shrink` under eager-SGD's partial collective (issue 26): the survivors of a
killed rank go on in a new generation (``runtime.partial.regroup``).

Each end-to-end test is one local job of logreg ranks with injected delays (so ranks are late,
skip rounds and contribute stale gradients); the reference rebuilds the run from its record
alone, with the partial collective's semantics: each round sums the gradients its row names
(rank, job, version), each computed at its rank's own model (the generation's starting model
less the rounds that rank had adopted, ``adopted``), divided by the round's live ranks; a new
generation (after a loss or a heal) starts from the agreed model (every round applied); the
final parameters are the average of the last generation's models, each less the rounds its
rank adopted (``calls``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal

import numpy as np
import pytest
import torch
from tests.runtime import census_drill

from tailtrain.core.scenario import Scenario
from tailtrain.errors import UsageError
from tailtrain.faults import FaultPlan
from tailtrain.runtime.config import TrainConfig, build_world
from tailtrain.runtime.elastic.refusals import check_shrink
from tailtrain.runtime.elastic.shrink import Refused, Shrinker
from tailtrain.runtime.launching.checks import validate
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.failures import JobFailed
from tailtrain.runtime.launching.launch import launch
from tailtrain.runtime.partial.regroup import Member
from tailtrain.runtime.partial.rounds import _Run, batch, train_partial
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import Context
from tailtrain.strategies.registry import parse_strategy
from tailtrain.tasks import parse_task

SEED = 3
#: the samples of one job of one rank (logreg's batch, one micro-batch)
SAMPLES_A_JOB = parse_task("logreg", seed=SEED).batch_size


def config(workers: int, faults: list[str], strategy: str, iterations: int = 16) -> TrainConfig:
    s = Scenario(
        task="logreg", workers=workers, iterations=iterations, eval_every=1000, delay="exp:rate=40"
    )
    return TrainConfig(
        scenario=s,
        strategy=strategy,
        seed=SEED,
        timeout=60,
        faults=FaultPlan.parse(faults, workers),
        on_rank_loss="shrink",
        inject=True,
    )


def run(cfg: TrainConfig, entry=None):
    return launch([cfg], reserve(Endpoint("127.0.0.1", 0)), entry)


def dies_in_census(cfg: TrainConfig, comm: Collectives):
    """Rank 2 checks in to the first census, then dies before the group forms."""
    return census_drill.dies_in_census(train_partial, cfg, comm)


def reference(cfg: TrainConfig, steps: list[dict], calls: dict[str, list]) -> np.ndarray:
    """The run's final parameters rebuilt from its record (module docstring)."""
    world, _ = build_world(cfg)
    task = world.task
    start = task.init_params(world.seed).double()  # the generation's starting model
    agreed, applied, generation = start.clone(), {}, 0
    steps_of: dict[int, torch.Tensor] = {}
    for row in steps:
        if row["generation"] != generation:  # a new generation: from the agreed model
            start, applied, generation = agreed.clone(), {}, row["generation"]
        total = torch.zeros_like(start)
        # within a generation a rank's gradients come in order: its j-th was computed at
        # its model less every round it had adopted before (the ``adopted`` of its jobs so far)
        for worker, job, adopted in zip(row["workers"], row["jobs"], row["adopted"], strict=True):
            seen = applied.setdefault(worker, [])
            if adopted >= 0 and adopted not in seen:
                seen.append(adopted)
            model = start - sum((steps_of[a] for a in seen), torch.zeros_like(start))
            _, grad = task.grads(model.float(), batch(world, worker, job))
            total += grad[0].double()
        steps_of[row["step"]] = row["lr"] * total / len(row["live"])
        agreed = agreed - steps_of[row["step"]]
    last = steps[-1]["generation"]
    finals = []
    for worker in steps[-1]["live"]:
        adopted = [c[3] for c in calls[str(worker)] if c[0] == last and c[3] is not None]
        finals.append(start - sum((steps_of[a] for a in adopted), torch.zeros_like(start)))
    return torch.stack(finals).mean(0).numpy()


def check_run(cfg: TrainConfig, by_rank, survivors: list[int]) -> list[dict]:
    record = by_rank[0][0].record
    steps = record.steps
    assert [r["step"] for r in steps] == list(range(cfg.scenario.iterations))
    assert steps[-1]["live"] == survivors
    want = reference(cfg, steps, record.summary["calls"])
    for rank in survivors:
        np.testing.assert_allclose(by_rank[rank][0].theta, want, rtol=1e-4, atol=1e-6)
    return steps


# ---- no process: the refusals and the rule -----------------------------------------------------
def test_the_partial_collective_refuses_what_it_cannot_shrink_in_one_line():
    ctx = Context(n_workers=4)
    majority = parse_strategy("eager:mode=majority")
    partial = "partial-collective"
    check_shrink(majority, partial, local=True, ctx=ctx)
    check_shrink(parse_strategy("eager:mode=solo"), partial, local=True, ctx=ctx)
    with pytest.raises(UsageError, match="torchrun"):
        check_shrink(majority, partial, local=False, ctx=ctx)
    with pytest.raises(UsageError, match="gloo"):
        check_shrink(majority, partial, local=True, ctx=ctx, on_cuda=True)
    with pytest.raises(UsageError, match="cannot follow a smaller world: it adapts its state"):
        check_shrink(parse_strategy("dbw-quorum"), partial, local=True, ctx=ctx)
    larger = parse_strategy("dropcompute:threshold=auto,compensate=larger-batch")
    with pytest.raises(UsageError, match=re.escape(larger.follow_refusal())):  # its own reason
        check_shrink(larger, partial, local=True, ctx=ctx)
    s = Scenario(task="logreg", workers=3, iterations=2)
    validate(TrainConfig(s, "eager:mode=majority", on_rank_loss="shrink"), local=True)


def test_a_ranks_run_holds_everything_a_regroup_reads_and_replaces():
    """``regroup.Member`` declares what a regroup needs of a rank's run, so that the module
    names nothing of the rank loop; the loop's run must hold every one of those fields."""
    declared = set(Member.__annotations__)
    held = {f.name for f in dataclasses.fields(_Run)}
    assert declared and declared <= held, sorted(declared - held)


def test_eager_follows_the_live_world():
    ctx = Context(n_workers=4, seed=1)
    for spec, k in (("eager:mode=majority", 1), ("eager:mode=quorum", 2)):
        rule = parse_strategy(spec)
        state = rule.adapt(rule.init(ctx), None)  # one round on
        smaller = rule.follow_world(state, Context(n_workers=3, seed=1))
        assert (smaller.n_workers, smaller.k, smaller.round) == (3, k, 1)
        plan = rule.plan(smaller)
        assert plan.initiator < 3
    quorum = parse_strategy("eager:mode=quorum,k=4")
    state = quorum.follow_world(quorum.init(ctx), Context(n_workers=2, seed=1))
    assert state.k == 2  # a K above the live ranks becomes all of them


# ---- real processes ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_killed_rank_under_majority_leaves_a_run_that_matches_its_record():
    cfg = config(4, ["kill:worker=3,step=5"], "eager:mode=majority")
    by_rank = run(cfg)
    steps = check_run(cfg, by_rank, [0, 1, 2])
    lives = [tuple(r["live"]) for r in steps]
    cut = lives.index((0, 1, 2))
    assert 5 <= cut < 16 and lives == [(0, 1, 2, 3)] * cut + [(0, 1, 2)] * (16 - cut)
    assert [r["dead"] for r in steps if r["dead"]] == [[3]]
    assert all(3 not in r["workers"] for r in steps[cut:])
    # the lost shard is counted, not silently missing: a job of rank 3's every round
    assert all(r["skipped"] == 0 for r in steps[:cut])
    assert all(r["skipped"] >= SAMPLES_A_JOB for r in steps[cut:])
    assert {r["quorum"] for r in steps} == {1}
    # the majority initiator is drawn among the live ranks after the shrink
    assert all(r["initiator"] in r["live"] for r in steps)
    generations = by_rank[0][0].record.summary["generations"]
    assert [g[0] for g in generations] == [1] and generations[0][2] == [3]
    assert "dead" in by_rank[3][0].record.summary


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_two_ranks_dying_together_leave_the_other_two():
    # both die at their own step 5; a partial collective's ranks reach it at different
    # times (late ranks skip rounds), so one census or two, never a rank counted after it died
    cfg = config(4, ["kill:worker=2,step=5", "kill:worker=3,step=5"], "eager:mode=majority")
    by_rank = run(cfg)
    steps = check_run(cfg, by_rank, [0, 1])
    assert sorted(d for r in steps for d in r["dead"]) == [2, 3]
    for dead in (2, 3):
        gone = next(i for i, r in enumerate(steps) if dead in r["dead"])
        assert all(dead not in r["workers"] + r["live"] for r in steps[gone:])


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_death_during_the_census_under_solo_leaves_one_generation_without_both():
    # rank 3 dies at step 4; rank 2 checks in to that census and dies before the group forms
    cfg = config(4, ["kill:worker=3,step=4"], "eager:mode=solo", iterations=12)
    by_rank = run(cfg, dies_in_census)
    steps = check_run(cfg, by_rank, [0, 1])
    assert {tuple(r["live"]) for r in steps} == {(0, 1, 2, 3), (0, 1)}
    assert [sorted(r["dead"]) for r in steps if r["dead"]] == [[2, 3]]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_killed_rank_0_stops_the_job_with_a_line_that_says_what_to_do():
    with pytest.raises(
        JobFailed, match=r"^rank 0 .*shrink goes on without any rank but 0.*--max-restarts 1"
    ):
        run(config(3, ["kill:worker=0,step=2"], "eager:mode=majority"))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_hung_initiator_is_left_behind_and_refused_when_it_wakes():
    # rank 2's main thread freezes (6 s) past the learned deadline (MIN_DEADLINE: these rounds
    # take ms); a majority round it initiates stalls the others, who go on without it; it
    # wakes after the run and asks to join: refused, its work counted nowhere
    cfg = config(3, ["freeze:worker=2,step=4,seconds=6"], "eager:mode=majority", iterations=30)
    by_rank = run(cfg)
    steps = check_run(cfg, by_rank, [0, 1])
    lives = [tuple(r["live"]) for r in steps]
    cut = lives.index((0, 1))
    assert cut >= 4 and lives[cut:] == [(0, 1)] * (30 - cut)
    assert steps[cut]["dead"] == [2]
    assert Refused.__name__ in by_rank[2][0].record.summary["left"]
    # the summary keeps the deadline that decided the break, as the allreduce's does
    summary = by_rank[0][0].record.summary
    assert 0 < summary["hang_deadline"] < 6
    assert summary["hang_deadline_learned"].startswith("in force when step")


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_killed_rank_started_again_heals_from_a_live_peer():
    # rank 2 dies at step 4 and is started again (--restart-lost 1): it asks to join, rank 0
    # says so in a round, and at that round's end every member takes it in with the lead's
    # agreed model (no checkpoint); the run is long enough for the restart (~1 s)
    cfg = config(3, ["kill:worker=2,step=4"], "eager:mode=majority", iterations=100)
    cfg = dataclasses.replace(cfg, restart_lost=1)
    by_rank = run(cfg)
    steps = check_run(cfg, by_rank, [0, 1, 2])
    lives = [tuple(r["live"]) for r in steps]
    cut, healed = lives.index((0, 1)), [r["step"] for r in steps if r["rejoined"]]
    assert len(healed) == 1 and healed[0] > cut >= 4
    assert lives == [(0, 1, 2)] * cut + [(0, 1)] * (healed[0] - cut) + [(0, 1, 2)] * (
        100 - healed[0]
    )
    assert steps[healed[0]]["rejoined"] == [2]
    # the rank started again took no job it may have done before it died
    after = steps[healed[0] :]
    jobs = [j for r in after for w, j in zip(r["workers"], r["jobs"], strict=True) if w == 2]
    assert min(jobs) > healed[0]


def dies_in_heal(cfg: TrainConfig, comm: Collectives):
    """Rank 1 dies (SIGKILL) as the members take a joiner in."""
    if comm.rank == 1:
        Shrinker.grow = lambda self, step, rows: os.kill(os.getpid(), signal.SIGKILL)
    return train_partial(cfg, comm)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_death_during_a_heal_runs_the_census_again_and_keeps_the_joiner():
    # rank 2 hangs (a majority round it initiates stalls the others) and is dropped; it wakes
    # and asks to join; as the members take it in, rank 1 dies: the census runs again
    cfg = config(3, ["freeze:worker=2,step=4,seconds=3"], "eager:mode=majority", iterations=150)
    by_rank = run(cfg, dies_in_heal)
    steps = check_run(cfg, by_rank, [0, 2])
    healed = [r for r in steps if r["rejoined"]]
    assert [(r["rejoined"], r["dead"], r["live"]) for r in healed] == [([2], [1], [0, 2])]
    assert "dead" in by_rank[1][0].record.summary
