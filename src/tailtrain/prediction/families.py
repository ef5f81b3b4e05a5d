"""Rows for the families ``predict``'s theory has no table for: Local-SGD, eager-SGD's partial
collectives (solo, majority, quorum at its best K) and DBW.

Closed form where one exists, else a seeded timing-only simulation (``task=none``) replaying
the same delays, and each row names its method:

* Local-SGD with period H (DropCompute App. B.3): a round is H local steps and one allreduce,
  E[T_round] = E[max_n S_n] + E[T^c] with S_n the sum of H M i.i.d. unit times, exact (or by
  quadrature) when that sum has a closed form (``theory.families``); the row's time is per
  round and its effective speedup H E[T_sync] / E[T_round] counts local steps as samples.
  The best period is the smallest H in :data:`PERIODS` within 5% of the highest rate: longer
  periods add model drift that a rate ignores.
* Eager-SGD solo, majority and quorum-K (Li et al. Sec. 4): no closed form for the iteration
  time; simulated. Quorum's best K follows ``predict``'s criterion on :func:`k_grid`.
* DBW (Xu, Neglia, Sebastianelli): k_t follows gradient statistics (DBW Eq. (19)), so a
  timing-only run cannot play its rule; its row is K-sync at ``predict``'s best K, the
  setting DBW's k_t aims for, and says so. Simulate it with a task to see k_t.

Simulated rows: effective speedup = gradients applied per second (eager counts stale
contributions, as Theorem 3 does for K-async) over that of a simulated ``sync`` run on the
same seed (common random numbers). Simulation runs up to :data:`SIM_MAX_WORKERS` workers.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from tailtrain.delays import DelayModel
from tailtrain.prediction.estimates import best_k
from tailtrain.prediction.scenario import DelayScenario, Prediction, Row, k_grid
from tailtrain.theory.families import closed_form
from tailtrain.theory.order_stats import expected_order_stats

PERIODS = (1, 2, 4, 8, 16)  #: Local-SGD periods H evaluated
PERIOD_SLACK = 0.05  #: best H: the smallest within this share of the highest rate
SIM_MAX_WORKERS = 1024  #: timing-only simulation up to this many workers
SIM_UNITS = 60_000  #: worker-steps per simulated run (bounds its time)
EXTRA = ("local-sgd", "eager-solo", "eager-majority", "eager-quorum", "dbw")


def with_families(prediction: Prediction) -> Prediction:
    """``prediction`` with the Local-SGD, eager and DBW rows (and their notes) added."""
    rows, notes = extra_rows(prediction)
    return replace(prediction, rows=(*prediction.rows, *rows), notes=(*prediction.notes, *notes))


def extra_rows(prediction: Prediction) -> tuple[list[Row], list[str]]:
    """Local-SGD, eager and DBW rows for ``prediction``'s scenario, and notes."""
    s = prediction.scenario
    sync = next(r for r in prediction.rows if r.strategy == "sync").iteration_time
    rows, notes = _local_sgd_rows(s, sync)
    if s.groups <= SIM_MAX_WORKERS and not (s.pattern and s.pattern.time_scheduled):
        rows += _eager_rows(s)
    else:
        notes.append(
            f"eager rows need a simulation, run up to N={SIM_MAX_WORKERS}; try "
            f"'tailtrain simulate --task none --strategy eager:mode=quorum,k=K'"
        )
    best = next(r for r in prediction.rows if r.strategy == "k-sync" and r.best)
    rows.append(
        replace(
            best,
            strategy="dbw",
            spec="dbw",
            best=True,
            method=f"k-sync at best K={best.k} (DBW's k_t needs gradient statistics)",
        )
    )
    return rows, notes


def row_spec(row: Row) -> str:
    """The strategy spec that ``simulate`` and ``train`` accept for ``row``'s setting."""
    if row.spec is not None:
        return row.spec
    if row.strategy in ("sync", "async"):
        return row.strategy
    if row.strategy == "dropcompute":
        return f"dropcompute:threshold={row.threshold:.6g}"
    return f"{row.strategy}:k={row.k}"


def _local_sgd_rows(s: DelayScenario, sync_time: float) -> tuple[list[Row], list[str]]:
    law = _local_law(s)
    if law is None and s.groups > SIM_MAX_WORKERS:
        note = f"local-sgd needs a simulation here (no closed form), run up to N={SIM_MAX_WORKERS}"
        return [], [note]
    rows = []
    for period in PERIODS:
        spec = f"local-sgd:period={period}"
        if law is not None:
            stats = expected_order_stats(law(period), s.workers, [s.workers])
            time, stderr = float(stats.mean[0]) + s.comm_mean, 0.0
            row = _row("local-sgd", spec, s.workers, time, stderr, stats.method)
            rows.append(
                replace(_rate(row, period * sync_time / time), speedup_vs_sync=sync_time / time)
            )
        else:
            rows.append(simulated_row(s, spec, "local-sgd"))
    rates = np.array([r.effective_speedup for r in rows])
    best = int(np.flatnonzero(rates >= (1 - PERIOD_SLACK) * rates.max())[0])
    return [replace(r, best=i == best) for i, r in enumerate(rows)], []


def _local_law(s: DelayScenario):
    """H -> the exact law of H M i.i.d. unit times, when the scenario is i.i.d. and it has one
    (replica groups have none: a group's unit is a max, simulated)."""
    if s.group_size != 1 or s.group_cost != 0:
        return None
    if not s.iid or (not isinstance(s.comm, (int, float)) and s.comm.var > 0):
        return None
    form = closed_form(s.delay) if s.delay.exact else None
    if form is None:
        return None
    return lambda period: form.sum_of(period * (s.micro_batches or 1))


def _eager_rows(s: DelayScenario) -> list[Row]:
    modes = ("solo", "majority")
    rows = [simulated_row(s, f"eager:mode={mode}", f"eager-{mode}") for mode in modes]
    grid = [k for k in k_grid(s.groups, compact=True) if 1 < k < s.groups] or [s.groups]
    quorum = [simulated_row(s, f"eager:mode=quorum,k={k}", "eager-quorum", k) for k in grid]
    best, _ = best_k(
        [r.k for r in quorum],
        [r.effective_speedup for r in quorum],
        [r.effective_speedup_stderr for r in quorum],
    )
    rows.append(replace(next(r for r in quorum if r.k == best), best=True))
    return [replace(r, best=True) if r.strategy != "eager-quorum" else r for r in rows]


def simulated_row(s: DelayScenario, spec: str, strategy: str, k: int | None = None) -> Row:
    """A seeded timing-only run of ``spec`` against one of ``sync`` on the same seed."""
    iterations = int(np.clip(SIM_UNITS // s.workers, 50, 400))  # ranks drawn
    base = _throughput(s, "sync", iterations)
    time, rate, stderr = _throughput(s, spec, iterations)
    method = f"simulated(n={iterations}, seed={s.seed})"
    row = _row(strategy, spec, k or s.groups, time, stderr, method)
    return replace(
        _rate(row, rate / base[1]),
        speedup_vs_sync=base[0] / time,
        effective_speedup_stderr=rate / base[1] * stderr / time,
    )


def _throughput(s: DelayScenario, spec: str, iterations: int) -> tuple[float, float, float]:
    """(mean time per update, gradients applied per second, stderr of the mean time)."""
    from tailtrain.core.scenario import Scenario
    from tailtrain.sim.run import simulate  # torch: only when simulating
    from tailtrain.strategies.registry import parse_strategy

    scenario = Scenario(
        task="none",
        workers=s.workers,
        delay=s.delay.spec,
        pattern="iid" if s.pattern is None else s.pattern.spec,
        micro_batches=s.micro_batches,
        comm_time=_comm_spec(s.comm),
        iterations=iterations,
        group_size=s.group_size,
        group_cost=s.group_cost,
    )
    record = simulate(scenario, parse_strategy(spec), seed=s.seed)
    times = np.diff(np.concatenate([[0.0], record.column("time")]))
    applied = sum(_gradients(row) for row in record.steps)
    batches = np.array_split(times, 10)  # batch means: steps of one run are dependent
    stderr = float(np.std([b.mean() for b in batches], ddof=1) / math.sqrt(len(batches)))
    return float(times.mean()), applied / float(times.sum()), stderr


def _gradients(row: dict[str, Any]) -> float:
    """Worker mini-batch gradients in one update: micro-batches done / M on an allreduce."""
    if "completed" in row:
        return sum(row["completed"]) / row["micro_batches"]
    return float(len(row["workers"]))


def _comm_spec(comm: float | DelayModel) -> str | None:
    if isinstance(comm, DelayModel):
        return comm.spec
    return None if comm == 0 else repr(float(comm))


def _row(strategy: str, spec: str, k: int, time: float, stderr: float, method: str) -> Row:
    return Row(strategy, int(k), time, stderr, math.nan, math.nan, math.nan, method, spec=spec)


def _rate(row: Row, effective: float) -> Row:
    error = effective * row.iteration_time_stderr / row.iteration_time
    return replace(row, effective_speedup=effective, effective_speedup_stderr=error)
