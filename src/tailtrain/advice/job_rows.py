"""The rows ``advise`` prices in the job's own units (``advice.units``): DropCompute at the M
its hook needs where the job's steps are whole batches, and rebalance by per-sample shares
for a DDP job, with the notes that say how each was priced."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from tailtrain.advice.adopt import SHARES
from tailtrain.advice.recommend import (
    MODEL_ERROR,
    Ranked,
    checked_between,
    uncertainty,
)
from tailtrain.advice.units import (
    JobShape,
    StepCosts,
    candidate_ms,
    measured_rate,
    rebalance_shares,
    split_trace,
)
from tailtrain.delays.base import DelayModel
from tailtrain.delays.parse import parse_delay
from tailtrain.delays.trace import Trace
from tailtrain.prediction import DelayScenario, Row, predict
from tailtrain.prediction.families import row_spec, simulated_row

#: how a per-step trace is split into micro-batches (``advice.units``), said where it is
SPLIT_NOTE = (
    "each recorded step split into M parts as i.i.d. Gamma parts given their sum, fitted "
    "per rank to its step law's mean and variance (each step's total as recorded), a rank's "
    "fitted seconds per step that no sample count changes kept whole in the first part, "
    "never cut; no per-micro-batch overhead is assumed"
)


def in_job_units(
    ranked: list[Ranked],
    notes: list[str],
    last: Trace,
    job: JobShape,
    m: int | None,
    setup: str,
    comm: float | DelayModel,
    spread: float,
    seed: int,
    samples: int,
    folder: Path,
    cut: str = "",
) -> tuple[list[Ranked], list[str]]:
    """The rows as the job can run them (``advice.units``): DropCompute at the M it needs
    where the job has one batch per step (it cuts only between micro-batches), and for a
    DDP job rebalance by per-sample shares where the trace counts samples."""
    comm_mean = comm if isinstance(comm, (int, float)) else comm.mean
    if m is None:  # a per-step trace: DropCompute at M = 1 has nothing to cut
        ranked = [r for r in ranked if r.row.strategy != "dropcompute"]
        found = dropcompute_at_m(last, job, comm, spread, seed, samples, folder, cut)
        if found is not None:
            ranked.append(found)
            notes = [
                *notes,
                f"dropcompute: {dropcompute_note(job, setup)}; "
                f"at M={found.micro_batches} "
                f"(priced at M in {candidate_ms(job)}; {SPLIT_NOTE})",
            ]
    elif m > job.micro_batches:
        ranked = [
            replace(r, micro_batches=m) if r.row.strategy == "dropcompute" else r for r in ranked
        ]
    # under DropCompute the samples are those computed, not the batch: no global batch to deal
    shares = None
    if setup in SHARES and not job.cut:
        shares = rebalance_shares(last, comm_mean, job.accumulation)
    if shares is not None and np.array_equal(shares.per_step, job.samples):
        shares = None  # the shares the job already deals: that row is the job as measured
    if shares is not None:
        # over the job as measured (sync's row, 1.0) on the same steady steps, in samples per
        # second: the replay deals the whole global batch every step, where the measured
        # job's short steps deal fewer
        rate, sync, _ = measured_rate(last)
        ratio = shares.rate / rate
        row = Row(
            "rebalance",
            job.workers,
            shares.iteration_time,
            shares.stderr,
            sync / shares.iteration_time,
            ratio,
            ratio * shares.stderr / shares.iteration_time,
            PER_SAMPLE,
            best=True,
            spec="rebalance",
        )
        per_sample = Ranked(
            row, None, uncertainty(row, None, spread), shares=tuple(int(b) for b in shares.shares)
        )
        ranked = [r for r in ranked if r.row.strategy != "rebalance"] + [per_sample]
        notes = [*notes, costs_note(shares.costs)]
    if job.cut:
        notes = [
            *notes,
            f"the ranks computed {job.samples.tolist()} samples per step under {job.remedy}: "
            "its cut, not shares; rebalance is priced on a run without a cut (its dealt "
            "batches), so it has no row here",
        ]
    elif not job.equal:
        notes = [
            *notes,
            f"the ranks compute unequal batches {job.samples.tolist()} (the job already deals "
            "shares): sync is the job as measured, its shares kept; the K-family rows count "
            "gradients, not samples",
        ]
    return sorted(ranked, key=lambda r: -r.effective_speedup), notes


def costs_note(costs: StepCosts) -> str:
    """How the rebalance row priced each rank's step (``advice.units.step_costs``)."""
    if costs.fitted.any():
        fixed = ", ".join(f"{1e3 * a:.3g}" for a in costs.fixed)
        return (
            "rebalance: each rank's step fitted as a + c x samples on the trace's steps of "
            f"other counts (such as an epoch's short last batch): a = [{fixed}] ms per step "
            "that no share changes"
        )
    return (
        "rebalance: every step of a rank has one count, so each step is taken as "
        "proportional to its samples; a part fixed per step (a sleep, a per-step overhead), "
        "which no share changes, would make this forecast high"
    )


#: why DropCompute is priced at M micro-batches on the steps of a loop that accumulates
ACCUMULATED_NOTE = (
    "its threshold is checked between micro-batches that the DDP hook takes as one step's "
    "list (state.micro_batches), where this job accumulates loader batches under no_sync, "
    "which the hook cannot cut: the loop would be rewritten for it; priced with each step's "
    "batches split in M"
)
#: why DropCompute is priced at M micro-batches on a per-step trace
MICRO_NOTE = (
    "its threshold is checked between micro-batches (the DDP hook, StragglerStep), so a step "
    "of one batch has nothing to cut; priced with each step's batch split in M"
)
#: the same under Lightning, whose ``StragglerStrategy`` cuts between accumulated batches
LIGHTNING_NOTE = (
    "its threshold is checked between the accumulate_grad_batches micro-batches of a step "
    "(tailtrain.lightning.StragglerStrategy): at M, accumulate_grad_batches=M and each "
    "batch the step's samples / M; priced with each step's batches split in M"
)


def dropcompute_note(job: JobShape, setup: str) -> str:
    """Why and how DropCompute is priced at M on a per-step trace, for ``setup``'s job."""
    if setup == "lightning":
        return LIGHTNING_NOTE
    return MICRO_NOTE if job.accumulation == 1 else ACCUMULATED_NOTE


#: the method of the per-sample rebalance row (``advice.units.rebalance_shares``)
PER_SAMPLE = "replay per sample"


def dropcompute_at_m(
    last: Trace,
    job: JobShape,
    comm: float | DelayModel,
    spread: float,
    seed: int,
    samples: int,
    folder: Path,
    cut: str = "",
) -> Ranked | None:
    """DropCompute's best row at each M of :func:`candidate_ms` on the per-step trace split
    in M (``advice.units.split_trace``): predict's tau* and drop rate, simulated; the
    smallest M within the statistical uncertainty of the best (a micro-batch costs overhead
    the forecast does not price)."""
    found = []
    for m in candidate_ms(job):
        path = split_trace(last, m, folder / f"split{m}.csv", seed)
        scenario = DelayScenario(
            job.workers,
            parse_delay(f"trace:path={path}{cut}"),
            micro_batches=m,
            comm=comm,
            samples=samples,
            seed=seed,
        )
        row = next(r for r in predict(scenario).rows if r.strategy == "dropcompute")
        row = checked_between(row) if cut else row
        sim = simulated_row(scenario, row_spec(row), "dropcompute")
        found.append(Ranked(row, sim, uncertainty(row, sim, spread), micro_batches=m))
    if not found:
        return None
    top = max(found, key=lambda r: r.effective_speedup)

    def stat(r: Ranked) -> float:  # the model's own error is common to every M
        return math.sqrt(max(r.uncertainty**2 - (MODEL_ERROR * r.effective_speedup) ** 2, 0.0))

    return next(
        r
        for r in found
        if r.effective_speedup >= top.effective_speedup - math.hypot(stat(r), stat(top))
    )
