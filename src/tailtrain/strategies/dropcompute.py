"""DropCompute (Giladi et al., 2023): stop computing at a threshold tau, then allreduce.

Algorithm 1 on worker n at iteration i: compute micro-batches g_n^(m) while the elapsed compute
time stays below tau; then join the allreduce with what it has. The engine does the timing
(``tailtrain.sim.allreduce.timing`` documents the stopping conventions); this rule decides:

* ``plan``: tau for the round (infinite while calibrating), M under larger-batch compensation,
  how many rounds to run (extra steps), whether dropped micro-batches are re-queued;
* ``select``: worker n's gradient (the mean over its C_n completed micro-batches) enters with
  weight (C_n/M)/N, which is Eq. (1) with g_n = (1/M) sum of the computed g_n^(m)
  (``divide-by=m``), or C_n / sum_k C_k (``divide-by=computed``, App. B.2.2's stochastic
  correction: the allreduce also carries the counts). A worker with C_n = 0 joins with weight 0;
* ``adapt``: collects the measured t_{i,n}^(m) and T^c_i of calibration rounds and then runs
  Algorithm 2 (App. C.1, ``tailtrain.theory.dropcompute.empirical_threshold``) or picks the
  tau of a requested drop rate. Calibration repeats every ``recalibrate`` rounds if asked.
  Algorithm 2 models preemption (``stop=preempt``, the default); with ``stop=between`` it
  still returns the paper's tau*, while ``drop-rate=p`` follows the convention in force.

Compensation for dropped samples (Sec. 4.5), with p the measured drop rate and
R = M/E[M~] - 1 = p/(1-p): ``extra-steps`` runs R * I_base more rounds (the scenario's
iterations times 1/(1-p)); ``larger-batch`` computes M' = ceil(M/(1-p)) micro-batches (at most
2M) with tau unchanged; ``resample`` puts dropped micro-batches back in the worker's queue,
so they are computed in its next rounds, within the epoch.

Local-SGD (App. B.3) is the same rule with H > 1 local steps per round: the threshold is
compared with the compute time since the last model average, at each local step (and between
its micro-batches), and a worker past it skips its remaining local steps.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from tailtrain.errors import UsageError
from tailtrain.spec import Spec
from tailtrain.strategies.base import (
    AllreducePlan,
    ArrivalColumns,
    Context,
    Selection,
    StepStats,
    Strategy,
    Topology,
    WeightContract,
    Weighting,
)
from tailtrain.theory.dropcompute import empirical_threshold

log = logging.getLogger(__name__)

DIVIDE_BY = ("m", "computed")
COMPENSATIONS = ("none", "extra-steps", "larger-batch", "resample")
STOPS = ("preempt", "between")
#: larger-batch compensation grows M at most by this factor (a drop rate of at most 50%)
MAX_BATCH_GROWTH = 2


@dataclass(frozen=True)
class DropComputeState:
    """Threshold in force, current M, calibration samples and the counts behind the drop rate."""

    n_workers: int
    tau: float
    step: int = 0
    micro_batches: int | None = None
    window_times: tuple[np.ndarray, ...] = ()
    window_comm: tuple[float, ...] = ()
    computed: float = 0.0
    possible: float = 0.0
    #: the original ranks of the world the state plays for, in the order of its arrivals and
    #: of ``StepStats.micro_batch_times`` (None: 0..n_workers-1); a shrink changes it
    ranks: tuple[int, ...] | None = None
    #: the original ranks whose columns the calibration window holds (None: ``ranks``)
    window_ranks: tuple[int, ...] | None = None
    #: the last calibration's samples t[i, n, m] and T^c_i, and the original ranks of their
    #: columns, kept so that a changed world can run Algorithm 2 again (:meth:`follow_world`);
    #: equality leaves the arrays out (an array has no single truth value): tau, from them, is
    #: compared
    samples: np.ndarray | None = field(default=None, compare=False)
    sample_comm: np.ndarray | None = field(default=None, compare=False)
    sample_ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class DropCompute(Strategy):
    """DropCompute over an allreduce; ``period`` > 1 is Local-SGD with H = period local steps.

    Exactly one threshold source: ``threshold`` seconds (``inf`` = never drop), or
    ``drop_rate`` p (tau from calibration samples), or neither (Algorithm 2's tau*).
    """

    name: str = "dropcompute"
    threshold: float | None = None
    drop_rate: float | None = None
    calibrate: int = 20
    recalibrate: int | None = None
    divide_by: str = "m"
    compensate: str = "none"
    preempt: bool = True
    period: int = 1
    text: str = field(default="", compare=False)
    topology: ClassVar[Topology] = Topology.ALLREDUCE
    #: C_n / (H M): a rank's weight is its own share of the units (Eq. 1)
    weights: ClassVar[WeightContract] = WeightContract.OWN_COUNTS

    @property
    def averages_models(self) -> bool:
        """Local-SGD averages the models after its local steps, at any ``period`` (H = 1
        too: an average of models, not of gradients, under a stateful optimizer)."""
        return self.name == "local-sgd" or self.period > 1

    # ---- the rule ---------------------------------------------------------------------------
    def init(self, ctx: Context) -> DropComputeState:
        tau = math.inf if self.threshold is None else self.threshold
        live = None if ctx.live is None else tuple(ctx.live)
        return DropComputeState(n_workers=ctx.n_workers, tau=tau, ranks=live)

    def plan(self, state: DropComputeState) -> AllreducePlan:
        """tau (infinite in calibration rounds), M, H and the compensation for the round."""
        return AllreducePlan(
            k=state.n_workers,
            threshold=math.inf if self.measuring(state.step) else state.tau,
            preempt=self.preempt,
            micro_batches=state.micro_batches,
            local_steps=self.period,
            iteration_scale=self._iteration_scale(state),
            requeue_dropped=self.compensate == "resample",
        )

    def select(self, state: DropComputeState, arrivals: ArrivalColumns) -> Selection:
        """Weights C_n/M over N (divide-by=m) or over sum_k C_k/M (divide-by=computed)."""
        everyone = np.arange(len(arrivals))
        units = arrivals.units
        if self.divide_by == "m":
            return Selection(now=Weighting.of(arrivals, everyone, units, total=state.n_workers))
        # nobody computed anything: every weight is 0, and so is the update
        total = None if units.sum() > 0 else 1.0
        return Selection(now=Weighting.of(arrivals, everyone, units, total=total))

    def adapt(self, state: DropComputeState, stats: StepStats) -> DropComputeState:
        """Count computed units; in a calibration round keep t[n, m] and T^c (Algorithm 2)."""
        times = stats.micro_batch_times
        done = 0 if times is None else times.size - int(np.count_nonzero(np.isnan(times)))
        measuring = self.measuring(state.step)
        state = replace(
            state,
            step=state.step + 1,
            computed=state.computed + done,
            possible=state.possible + (0 if times is None else times.size),
        )
        if not measuring or times is None:
            return state
        state = replace(
            state,
            window_times=(*state.window_times, measured_columns(state, times)),
            window_comm=(*state.window_comm, stats.comm_time),
        )
        if len(state.window_times) < self.calibrate:
            return state
        return self._calibrated(state)

    def follow_world(self, state: DropComputeState, ctx: Context) -> DropComputeState | None:
        """The rule for the live world ``ctx.live`` (original ranks; None: 0..n-1) after ranks
        were lost or came back (``train --on-rank-loss shrink``). The divisor N of
        divide-by=m (Eq. 1) becomes the live count L; a fixed tau (and Local-SGD's period)
        stays, the counts go on.

        A calibrated tau follows too. Algorithm 2 (App. C.1) takes "number of workers N" as
        an input: T_i = max_n T_{i,n}^(M) is the slowest *live* worker's compute and
        M~_i(tau) counts over the live workers, so tau* is a function of the world. On a
        change it is run again on the kept samples of the live ranks only (the columns of the
        ranks lost are dropped; ``drop-rate=p`` picks its tau on them likewise): the tau
        the paper's rule gives for L workers with the same measurements, no new calibration
        rounds. A calibration still running keeps the live ranks' columns of the rounds it
        measured and goes on in the live world; it ends, as it would have, after
        ``calibrate`` rounds, and Algorithm 2 then sees only the live ranks. A rank taken in
        again that the samples never measured (it was lost before the calibration ended) is
        left out of them: tau* is the measured ranks', Assumption C.1's identical workers
        standing for it.

        ``compensate=larger-batch`` cannot follow (None): M' = ceil(M/(1-p)) (Sec. 4.5) sizes
        every rank's batch from the drop rate of the tau of the world measured; a new tau*
        would need a new M' and a new global batch layout in mid-run."""
        if self.compensate == "larger-batch":
            return None
        live, known = ctx.ranks, state.window_ranks or old_ranks(state)
        state = replace(state, n_workers=ctx.n_workers, ranks=live)
        if self.threshold is not None:
            return state  # tau is fixed: the window stays empty
        if state.window_times:
            keep = [i for i, r in enumerate(known) if r in live]
            window = tuple(t[keep] for t in state.window_times)
            state = replace(state, window_times=window, window_ranks=tuple(known[i] for i in keep))
        if state.samples is None:
            return state
        cols = [i for i, r in enumerate(state.sample_ranks) if r in live]
        if not cols:  # none of the measured ranks is live: tau stays the measured world's
            return state
        tau = self._choose_tau(state.samples[:, cols], state.sample_comm)
        log.info("%s: tau = %.6g s for the live ranks %s", self.describe(), tau, list(live))
        return replace(state, tau=tau)

    def follow_refusal(self) -> str:
        return (
            "compensate=larger-batch sizes every rank's batch M' = ceil(M/(1-p)) from the drop "
            "rate of the world it measured (Sec. 4.5); a new world's tau* would need a new M' "
            "in mid-run"
        )

    # ---- calibration (Algorithm 2) ------------------------------------------------------------
    @property
    def calibrates(self) -> bool:
        """Whether rounds must be measured undropped: tau or M' comes from samples."""
        return self.threshold is None or self.compensate == "larger-batch"

    def measuring(self, step: int) -> bool:
        """Whether round ``step`` is a calibration round (tau = inf, every unit measured)."""
        if not self.calibrates:
            return False
        if self.recalibrate is None:
            return step < self.calibrate
        return step % self.recalibrate < self.calibrate

    def _calibrated(self, state: DropComputeState) -> DropComputeState:
        t = np.stack(state.window_times)
        comm = np.array(state.window_comm, dtype=np.float64)
        # a round whose T^c is not known yet (a runtime's first) counts the window's mean
        known = comm[~np.isnan(comm)]
        comm = np.where(np.isnan(comm), known.mean() if known.size else 0.0, comm)
        tau = self._choose_tau(t, comm) if self.threshold is None else self.threshold
        m = state.micro_batches
        if self.compensate == "larger-batch" and m is None:
            m = larger_batch(t.shape[2], expected_drop_rate(t, tau, self.preempt))
        log.info("%s: tau = %.6g s after %d calibration rounds", self.describe(), tau, len(t))
        ranks = state.window_ranks or old_ranks(state)
        return replace(
            state,
            tau=tau,
            micro_batches=m,
            window_times=(),
            window_comm=(),
            window_ranks=None,  # the next calibration measures every rank of the world
            samples=t,
            sample_comm=comm,
            sample_ranks=ranks,
        )

    def _choose_tau(self, t: np.ndarray, comm: np.ndarray) -> float:
        if self.drop_rate is not None:
            return threshold_for_drop_rate(t, self.drop_rate, self.preempt)
        return empirical_threshold(t, comm).threshold

    def _iteration_scale(self, state: DropComputeState) -> float:
        """Sec. 4.5: I_base (1 + R) rounds with R = M / E[M~] - 1, E[M~] as measured so far."""
        if self.compensate != "extra-steps" or state.computed <= 0:
            return 1.0
        return state.possible / state.computed

    # ---- what the engine needs before the first round ---------------------------------------
    def micro_batch_capacity(self, micro_batches: int | None) -> int | None:
        """Most micro-batches a local step may need: M, or 2M under larger-batch compensation."""
        if self.compensate != "larger-batch":
            return micro_batches
        if micro_batches is None:
            raise UsageError(
                f"{self.describe()!r}: compensate=larger-batch scales the number of "
                "micro-batches M; give --micro-batches M"
            )
        return MAX_BATCH_GROWTH * micro_batches

    def describe(self) -> str:
        return self.text or self.name


def old_ranks(state: DropComputeState) -> tuple[int, ...]:
    """The original ranks of the world ``state`` plays for (``DropComputeState.ranks``)."""
    return tuple(range(state.n_workers)) if state.ranks is None else state.ranks


def measured_columns(state: DropComputeState, times: np.ndarray) -> np.ndarray:
    """The rows of ``times`` (one per rank of the world, in order) of the ranks the window
    measures: all of them unless a rank was taken in during the calibration (it joins the
    next one, :meth:`DropCompute.follow_world`)."""
    if state.window_ranks is None or state.window_ranks == old_ranks(state):
        return times
    live = old_ranks(state)
    return times[[live.index(r) for r in state.window_ranks]]


def expected_drop_rate(t: np.ndarray, tau: float, preempt: bool) -> float:
    """1 - E[M~]/M on samples t[i, n, m] under the engine's stopping convention."""
    return 1.0 - float(counted(np.cumsum(t, axis=-1), tau, preempt).mean())


def may_start(elapsed: Any, tau: float, preempt: bool) -> Any:
    """The stopping convention's scalar half, for an engine between units (the runtime, a
    user's loop): whether a unit may start at ``elapsed`` = T^(u-1) seconds into the round,
    i.e. whether it can still count. Preempting: T^(u-1) < tau; checking between units:
    T^(u-1) <= tau. Floats or arrays."""
    return elapsed < tau if preempt else elapsed <= tau


def finishes(elapsed: Any, tau: float, preempt: bool) -> Any:
    """The other half: whether a started unit that ends at ``elapsed`` = T^(u) counts.
    Preempting (Algorithm 1), only before tau: T^(u) < tau; between units, always (a device
    does not abandon a unit it began). Floats or arrays."""
    return elapsed < tau if preempt else True


def counted(cumulative: np.ndarray, tau: float, preempt: bool) -> np.ndarray:
    """Whether each unit counts, from the partial sums T^(u) along the last axis: it starts
    (:func:`may_start` at T^(u-1), T^(0) = 0) and it finishes (:func:`finishes` at T^(u)).

    Preempting (Algorithm 1) that is T^(u) < tau, as T^(u-1) <= T^(u); checking between
    units (the reference code), T^(u-1) <= tau. Each branch computes only its half (the
    simulator calls this on every round's draws of all workers)."""
    if preempt:
        return finishes(cumulative, tau, preempt)
    return may_start(elapsed_before(cumulative), tau, preempt)


def elapsed_before(cumulative: np.ndarray) -> np.ndarray:
    """T^(u-1) for every unit u, from the same partial sums (so comparisons are exact)."""
    zeros = np.zeros_like(cumulative[..., :1])
    return np.concatenate([zeros, cumulative[..., :-1]], axis=-1)


def threshold_for_drop_rate(t: np.ndarray, rate: float, preempt: bool) -> float:
    """The least tau whose empirical drop rate on samples t[i, n, m] is at most ``rate`` < 1.

    The share of counted units is the empirical cdf of the pooled partial sums (T^(u) < tau
    when preempting, T^(u-1) <= tau otherwise), so tau is one of their order statistics;
    ``tailtrain.theory`` has no inverse of E[M~](tau), hence this np.partition.
    """
    cumulative = np.cumsum(t, axis=-1)
    pooled = (cumulative if preempt else elapsed_before(cumulative)).ravel()
    need = max(1, math.ceil((1.0 - rate) * pooled.size - 1e-9))
    kth = float(np.partition(pooled, need - 1)[need - 1])
    # preempting counts T^(u) < tau strictly, so tau sits just above the order statistic
    return float(np.nextafter(kth, math.inf)) if preempt else kth


def larger_batch(micro_batches: int, drop_rate: float) -> int:
    """M' = ceil(M / (1 - p)) (Sec. 4.5), at most ``MAX_BATCH_GROWTH`` M."""
    cap = MAX_BATCH_GROWTH * micro_batches
    if drop_rate >= 1 - 1 / MAX_BATCH_GROWTH:
        log.warning("drop rate %.3f: larger-batch compensation capped at M' = %d", drop_rate, cap)
        return cap
    return min(cap, math.ceil(micro_batches / (1.0 - drop_rate) - 1e-9))


# ---- builders ---------------------------------------------------------------------------------
KEYS = ("threshold", "drop-rate", "calibrate", "recalibrate", "divide-by", "compensate", "stop")


def build_dropcompute(spec: Spec) -> DropCompute:
    """``dropcompute[:threshold=SECONDS|auto|inf][,drop-rate=p][,calibrate=I][,recalibrate=R]
    [,divide-by=m|computed][,compensate=none|extra-steps|larger-batch|resample]
    [,stop=preempt|between]``; threshold=auto (Algorithm 2) by default."""
    spec.require_known(KEYS)
    return DropCompute(name="dropcompute", text=spec.text, **parse_options(spec, default="auto"))


def parse_options(spec: Spec, *, default: str, stop: str = "preempt") -> dict:
    """The DropCompute options of ``spec`` as keyword arguments of :class:`DropCompute`;
    ``default`` is the threshold and ``stop`` the stopping convention when none is given."""
    threshold, drop_rate = _threshold(spec, default)
    calibrate = spec.get_int("calibrate", 20, minimum=1)
    recalibrate = spec.get_int("recalibrate", 0, minimum=0) or None
    if recalibrate is not None and recalibrate <= calibrate:
        raise UsageError(
            f"{spec.text!r}: recalibrate={recalibrate} must exceed calibrate={calibrate} "
            "(each recalibration measures `calibrate` undropped rounds)"
        )
    if recalibrate is not None and threshold is not None:
        raise UsageError(f"{spec.text!r}: recalibrate needs threshold=auto or drop-rate=p")
    return {
        "threshold": threshold,
        "drop_rate": drop_rate,
        "calibrate": calibrate,
        "recalibrate": recalibrate,
        "divide_by": _choice(spec, "divide-by", "m", DIVIDE_BY),
        "compensate": _choice(spec, "compensate", "none", COMPENSATIONS),
        "preempt": _choice(spec, "stop", stop, STOPS) == "preempt",
    }


def _threshold(spec: Spec, default: str) -> tuple[float | None, float | None]:
    """(seconds or None for Algorithm 2, drop rate or None) from threshold= and drop-rate=."""
    if spec.has("drop-rate"):
        if spec.has("threshold"):
            raise UsageError(f"{spec.text!r}: give threshold= or drop-rate=, not both")
        rate = spec.get_float("drop-rate", minimum=0.0)
        if not rate < 1:
            raise UsageError(f"{spec.text!r}: drop-rate={rate:g} must be in [0, 1)")
        return None, rate
    if spec.get_str("threshold", default) == "auto":
        return None, None
    if not spec.has("threshold"):
        return float(default), None
    return spec.get_float("threshold", positive=True), None


def _choice(spec: Spec, key: str, default: str, allowed: tuple[str, ...]) -> str:
    value = spec.get_str(key, default)
    if value not in allowed:
        raise UsageError(
            f"{spec.text!r}: {key}={value!r} is unknown; use one of {', '.join(allowed)}"
        )
    return value
