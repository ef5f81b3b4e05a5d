"""Rebalance: give each rank the share of the global batch it can finish (issue 25).

A persistent straggler (an older GPU, a throttled node) is slow every step, so instead of
waiting for it (sync) or dropping its tail every step (DropCompute, Giladi et al. 2023), rank n
computes m_n micro-batches with sum_n m_n = N M: the global batch sync would draw is dealt
to the ranks by their shares, so no sample is lost and no rank's data is under-represented.

* ``plan``: the shares m_n in force (equal, m_n = M, until the warm-up ends), always
  named, so an engine deals the global batch the same way from the first step;
* ``select``: rank n's gradient G_n (the mean over its C_n completed micro-batches) enters
  with weight (C_n / M) / N, so sum_n w_n G_n = (1 / (N M)) sum of every micro-batch
  gradient: single-process SGD on the concatenated global batch (DropCompute Eq. 1 with M
  replaced by the shares; a rank knows its own C_n, the allreduce contract);
* ``adapt``: each step records rank n's mean per-micro-batch time; the estimate t_n is the
  median of those over the last ``window`` steps (robust to an intermittent slow step, and
  unbiased in ratio for a multiplicative slowdown). The optimal shares for t are the
  makespan-optimal ones: T* = the smallest T with sum_n max(floor, floor(T / t_n)) >= N M,
  m_n = floor(T* / t_n), then trimmed to N M (:func:`optimal_shares`); the fluid shares are
  x_n = N M (1/t_n) / sum_k (1/t_k), with T_x = x_n t_n their common finish time, and
  m_n t_n <= max(t_n, T_x + max_k t_k), m_n >= floor(x_n) - 1 where the floor binds no
  rank. Hysteresis: the shares move only when the predicted step time max_n m_n t_n would
  shrink by more than ``hysteresis`` plus NOISE_Z + sqrt(2 ln N) standard errors of the
  estimates (from their median absolute deviation over the window), so i.i.d. noise does
  not move them.

``then=dropcompute`` composes DropCompute's threshold on top, for the intermittent noise
that no share can predict (optax-style ``chain``: rebalance supplies the shares, DropCompute
the threshold tau and the weights, which are the same C_n/M over N). DropCompute's
Algorithm 2 measures rounds of M units; a rank with m_n != M is shown to it as M units along
its measured cumulative time (:func:`on_nominal_units`), exact when m_n = M. The
micro-batches the threshold cuts are not lost: they are dealt first in the next step's global
batch with ``defer=true`` (``AllreducePlan.carry_cut``, ``tasks.stream.CarryOver``), so every
micro-batch of the stream is still computed exactly once and the combination drops no sample;
the default, ``defer=false``, drops them, as DropCompute does (and runs wherever shares are
dealt; the carry needs an engine that does ``carry``).

``deal=demand`` (issue 25) deals no shares: the step's micro-batches (the carried ones first,
then fresh ones of the stream) go one at a time to whichever rank asks next, until N M of
them are complete; the micro-batch each rank has in flight then is cut and dealt first in
the next step, so none is lost and every update holds N M micro-batches, as sync's does.
Each rank computes all the step long, whatever its speed, with no threshold to calibrate.
The decision is :func:`on_demand`; the engines own who asks when (the virtual clock in
``simulate``). The pool is the world's, not a rank's: when ranks are lost
(``train --on-rank-loss shrink``) the live ones deal the same N M micro-batches among
themselves, so the global batch is kept, where shares keep the per-rank batch and the global
batch shrinks to the live ranks' (:meth:`Rebalance.follow_world`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
from tailtrain.strategies.dropcompute import KEYS as DROPCOMPUTE_KEYS
from tailtrain.strategies.dropcompute import DropCompute, elapsed_before, parse_options

#: standard errors of the estimates a predicted gain must exceed before the shares move, on
#: top of sqrt(2 ln N), the expected largest of N standard normal deviations
NOISE_Z = 3.0
#: median absolute deviation to standard deviation (normal), and the median's efficiency
MAD_SCALE, MEDIAN_SE = 1.4826, 1.2533
REBALANCE_KEYS = ("warmup", "window", "hysteresis", "floor", "then", "defer", "deal")
THEN = ("dropcompute",)
#: how the step's global batch reaches the ranks: by the shares, or on demand (issue 25)
DEAL_MODES = ("shares", "demand")


@dataclass(frozen=True)
class RebalanceState:
    """Shares in force, the window of per-step mean micro-batch times (W, N) and the
    composed rule's state."""

    n_workers: int
    micro_batches: int
    shares: np.ndarray
    window: np.ndarray
    step: int = 0
    moves: int = 0
    inner: Any = None
    #: the original ranks of the world the shares are for, in order (None: 0..n_workers-1);
    #: a shrink changes it (:meth:`Rebalance.follow_world`)
    ranks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Rebalance(Strategy):
    """Per-rank micro-batch shares proportional to measured speed (module docstring)."""

    name: str = "rebalance"
    warmup: int = 10
    window: int = 50
    hysteresis: float = 0.05
    floor: int = 1
    then: DropCompute | None = None
    #: with ``then``: deal the micro-batches its threshold cuts in the next step
    defer: bool = False
    #: ``shares``: rank n computes m_n; ``demand``: the pool to whichever rank asks next
    deal: str = "shares"
    text: str = field(default="", compare=False)
    topology: ClassVar[Topology] = Topology.ALLREDUCE
    #: C_n / M over N: a rank's weight is its own count (DropCompute Eq. 1)
    weights: ClassVar[WeightContract] = WeightContract.OWN_COUNTS

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        """Engines must deal per-rank shares (``AllreducePlan.shares``) and, when a composed
        threshold's cut is deferred, carry it to the next step (``carry_cut``); under
        ``deal=demand`` deal the pool on demand (``AllreducePlan.on_demand``), which carries
        its own cut units (``topology.allreduce.RoundData.on_demand``), not a threshold's."""
        if self.deal == "demand":
            return frozenset({"shares", "demand"})
        return frozenset({"shares", "carry"}) if self.carries else frozenset({"shares"})

    @property
    def carries(self) -> bool:
        """Whether the plans ask for the cut micro-batches to be dealt again."""
        return self.deal == "demand" or (self.then is not None and self.defer)

    def init(self, ctx: Context) -> RebalanceState:
        n, m = ctx.n_workers, ctx.micro_batches
        if self.floor > m:
            raise UsageError(
                f"{self.describe()!r}: floor={self.floor} exceeds the {m} micro-batches a "
                "rank computes per step; lower floor or raise --micro-batches"
            )
        return RebalanceState(
            n_workers=n,
            micro_batches=m,
            shares=np.full(n, m, dtype=np.int64),
            window=np.full((self.window, n), np.nan),
            inner=None if self.then is None else self.then.init(ctx),
            ranks=None if ctx.live is None else tuple(ctx.live),
        )

    def plan(self, state: RebalanceState) -> AllreducePlan:
        """The shares in force (all M until they move: a sync round) and the composed
        rule's threshold."""
        base = (
            AllreducePlan(k=state.n_workers) if self.then is None else self.then.plan(state.inner)
        )
        return replace(
            base,
            shares=tuple(state.shares.tolist()),
            carry_cut=self.carries,
            on_demand=self.deal == "demand",
        )

    def select(self, state: RebalanceState, arrivals: ArrivalColumns) -> Selection:
        """Weights (C_n / M) / N: each rank by the samples it contributed, N the global batch
        in rank batches, sum_n m_n / M (the pool's N M / M = N on demand, whatever the live
        count after a shrink; the live ranks' L for shares: :meth:`follow_world`)."""
        if self.then is not None:
            return self.then.select(state.inner, arrivals)
        index = np.arange(len(arrivals))
        total = int(state.shares.sum()) / state.micro_batches
        return Selection(now=Weighting.of(arrivals, index, arrivals.units, total=total))

    def adapt(self, state: RebalanceState, stats: StepStats) -> RebalanceState:
        """Record the step's per-rank mean micro-batch time; after the warm-up, move the
        shares when the gain clears the hysteresis."""
        times = stats.micro_batch_times
        inner = state.inner
        if self.then is not None:
            nominal = (
                None
                if times is None
                else on_nominal_units(times, state.shares, state.micro_batches)
            )
            inner = self.then.adapt(inner, replace(stats, micro_batch_times=nominal))
        window = state.window
        if times is not None and self.window:
            window = window.copy()
            window[state.step % self.window] = per_unit_time(times)
        state = replace(state, step=state.step + 1, window=window, inner=inner)
        if state.step < self.warmup or self.deal == "demand":  # on demand: no share moves
            return state
        return self._moved(state)

    def _moved(self, state: RebalanceState) -> RebalanceState:
        filled = state.window[: min(state.step, self.window)]
        estimate = robust_estimate(filled)
        if estimate is None:
            return state
        t, noise = estimate
        total = state.n_workers * state.micro_batches
        candidate = optimal_shares(t, total, self.floor)
        now, best = makespan(state.shares, t), makespan(candidate, t)
        if now <= best * (1.0 + self.hysteresis + noise):
            return state
        return replace(state, shares=candidate, moves=state.moves + 1)

    def follow_world(self, state: RebalanceState, ctx: Context) -> RebalanceState | None:
        """The state for the live world ``ctx.live`` (``train --on-rank-loss shrink``): the
        window keeps the live ranks' columns (a rank taken in again starts unmeasured, NaN),
        and the global batch is dealt again. The same world (a resume) keeps the state as it
        is.

        * ``deal=demand``: the pool is the world's, whatever its size: the live ranks deal the
          whole global batch of N M micro-batches of the same stream among themselves (the
          shares, which only name the pool, spread it evenly over them, :func:`spread`), so
          every update still applies N M micro-batches and divides by N (:meth:`select`).
          The carried cut is the round's, every rank's alike (``RoundData.on_demand``): a
          lost rank's cut units are in it and go to whoever asks first in the next step;
        * shares: each live rank keeps its own M micro-batches' worth of the global batch,
          sum_n m_n = L M, as sync's shrink keeps the per-rank batch, so the global batch is
          the live ranks' shards and a lost rank's shard is dealt to nobody. After the
          warm-up, with every live rank measured, they are the makespan-optimal shares of the
          window's estimates (no hysteresis: the old shares are for another world);
          otherwise equal, m_n = M, until the estimates move them. A composed DropCompute
          follows too (its tau* for the live ranks). ``defer=true`` cannot follow (None,
          :meth:`follow_refusal`)."""
        demand = self.deal == "demand"
        if self.carries and not demand:
            return None
        inner = None if self.then is None else self.then.follow_world(state.inner, ctx)
        if self.then is not None and inner is None:
            return None
        live = ctx.ranks
        known = tuple(range(state.n_workers)) if state.ranks is None else state.ranks
        if live == known:  # the same world (a resume): the shares in force stay
            return state
        window = np.full((self.window, len(live)), np.nan)
        for n, rank in enumerate(live):
            if rank in known:
                window[:, n] = state.window[:, known.index(rank)]
        if demand:  # the pool, N M, whatever the live count
            shares = spread(int(state.shares.sum()), len(live))
        else:
            shares = np.full(len(live), state.micro_batches, dtype=np.int64)
            estimate = robust_estimate(window[: min(state.step, self.window)])
            if state.step >= self.warmup and estimate is not None:
                total = len(live) * state.micro_batches
                shares = optimal_shares(estimate[0], total, self.floor)
        return replace(
            state, n_workers=len(live), ranks=live, shares=shares, window=window, inner=inner
        )

    def follow_refusal(self) -> str:
        """Why ``defer=true`` refuses a changing world: the cut it carries is the next step's
        first micro-batches of the global batch of the ranks' own shards (``CarryOver``),
        and a lost rank's shard of it would be dealt to nobody or twice. (``deal=demand``
        follows: its cut is the pool's, :meth:`follow_world`.)"""
        return (
            "defer=true carries the micro-batches tau cut into the next step's global batch, "
            "and a lost rank's carried share has no owner; use defer=false"
        )

    def describe(self) -> str:
        return self.text or self.name


def spread(pool: int, ranks: int) -> np.ndarray:
    """``pool`` micro-batches named over ``ranks`` ranks as evenly as integers go (the first
    ones take the remainder): ``deal=demand``'s shares, which only say how large the pool is
    (a rank computes what it asks for)."""
    shares = np.full(ranks, pool // ranks, dtype=np.int64)
    shares[: pool % ranks] += 1
    return shares


def demand_end(cumulative: np.ndarray, pool: int) -> np.ndarray:
    """When a step dealt on demand ends (:func:`on_demand`): the ``pool``-th smallest of the
    ranks' completion times ``cumulative[..., n, u]``, for every step of the leading axes at
    once (``predict`` passes many; a value, so ties need no order)."""
    flat = cumulative.reshape(*cumulative.shape[:-2], -1)
    return np.partition(flat, pool - 1, axis=-1)[..., pool - 1]


def on_demand(cumulative: np.ndarray, pool: int) -> tuple[np.ndarray, np.ndarray]:
    """A step dealt on demand until ``pool`` (N M) micro-batches are complete (issue 25).

    ``cumulative[n, u]`` is T_n^(u), when rank n's u-th unit would end if it kept
    computing; it asks for unit u at T_n^(u-1) (T^(0) = 0). Completions are counted in
    time order (ties to the lower rank): the step ends at E, the ``pool``-th completion,
    and exactly those ``pool`` units count. A rank is dealt every unit it asks for before
    E, so every rank is busy until E and the unit in flight at E is cut, to be dealt again
    first in the next step (DropCompute Algorithm 1's preemption, with E for tau). Asks are
    served in time order (ties to the lower rank), the k-th ask taking the step's k-th
    micro-batch (the carried ones, then fresh ones of the stream).

    Out (N, U) each: ``index``, the micro-batch each unit is dealt (-1: none), and
    ``counted``. Per rank both are prefixes and at most one dealt unit is not counted. The
    engines own the clock: ``simulate`` passes its draws; ``train``'s counter must serve
    asks and completions in the same order. Vectorised: two stable sorts of the N U units."""
    n_units = cumulative.size
    if pool > n_units:
        raise ValueError(f"a pool of {pool} micro-batches needs as many units, got {n_units}")
    by_finish = np.argsort(cumulative, axis=None, kind="stable")  # rank-major: ties to rank
    counted = np.zeros(cumulative.shape, dtype=bool)
    counted.flat[by_finish[:pool]] = True
    end = demand_end(cumulative, pool) if pool else 0.0
    asks = elapsed_before(cumulative)
    dealt = counted | (asks < end)
    order = np.argsort(np.where(dealt, asks, np.inf), axis=None, kind="stable")
    served = int(np.count_nonzero(dealt))
    index = np.full(cumulative.shape, -1, dtype=np.int64)
    index.flat[order[:served]] = np.arange(served)
    return index, counted


def deals(k: int, pool: int, cuts_in_flight: bool) -> bool:
    """Whether the k-th ask (from 0) of a step dealt on demand gets a unit.

    An engine that cuts the units in flight when the pool completes (:func:`on_demand`:
    ``simulate``, and ``train``, whose units end in an injected sleep it can wake) deals every
    ask until then. One that cannot cut a unit in flight (a real model's forward and backward:
    ``integrate.sharded``) deals the pool's ``pool`` units alone: a unit past the pool could
    count only by displacing one in flight, which must then finish anyway, so racing it ends
    no step sooner and wastes its compute. There every dealt unit counts, nothing is carried,
    and the step ends at its last unit's completion: greedy list scheduling of the pool, which
    waits for at most one unit of each rank (under ``bench_sharded``'s slower-group law it
    reaches 1.211x sync's samples per second against 1.226x with instant cuts)."""
    return cuts_in_flight or k < pool


def pool_end(cumulative: np.ndarray, pool: int) -> np.ndarray:
    """When a step that deals its pool alone ends (:func:`deals` without cuts): the asks are
    served in time order and the ``pool`` earliest get the units, so rank n computes the
    units whose ask time T_n^(u-1) is among them, and the step ends at the latest of their
    completions. ``cumulative[..., n, u]`` as in :func:`on_demand`, for every step of the
    leading axes at once. Never before :func:`demand_end` (the pool's completions are then
    the first ``pool`` asks' ones)."""
    asks = elapsed_before(cumulative)
    flat = asks.reshape(*asks.shape[:-2], -1)
    last_ask = np.partition(flat, pool - 1, axis=-1)[..., pool - 1]
    served = asks <= last_ask[..., None, None]  # ties would deal one more: a float's chance
    return np.where(served, cumulative, -np.inf).max(axis=(-2, -1))


def per_unit_time(times: np.ndarray) -> np.ndarray:
    """Each rank's mean measured micro-batch time this step (NaN: none measured)."""
    times = np.asarray(times, dtype=np.float64)
    count = np.count_nonzero(~np.isnan(times), axis=1)
    total = np.nansum(times, axis=1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def robust_estimate(window: np.ndarray) -> tuple[np.ndarray, float] | None:
    """(t_n, relative noise) from per-step mean times (W, N): t_n the median over steps, the
    noise NOISE_Z + sqrt(2 ln N) standard errors of a median (the largest of N estimates
    errs by about sqrt(2 ln N) of them), from the ranks' median relative MAD. None
    while some rank has no measurement (its speed is unknown)."""
    seen = np.count_nonzero(~np.isnan(window), axis=0)
    if window.size == 0 or seen.min() == 0:
        return None
    # np.median where nothing is NaN (every round in train and simulate): the same values,
    # and nanmedian's masked-array path for small arrays cost ~0.4 ms a call, twice a round
    # on every rank's critical path (bench/bench_faults.py's rebalance rows)
    median = np.median if seen.min() == window.shape[0] else np.nanmedian
    t = median(window, axis=0)
    if not (t > 0).all():
        return None
    spread = MAD_SCALE * median(np.abs(window - t), axis=0) / t
    z = NOISE_Z + math.sqrt(2.0 * math.log(window.shape[1]))
    noise = z * MEDIAN_SE * float(np.median(spread)) / math.sqrt(float(seen.min()))
    return t, noise


def makespan(shares: np.ndarray, t: np.ndarray) -> float:
    """The step's compute time max_n m_n t_n with per-micro-batch times t."""
    return float((shares * t).max())


def optimal_shares(
    t: np.ndarray, total: int, floor: int = 1, fixed: np.ndarray | None = None
) -> np.ndarray:
    """Integer shares m_n >= ``floor``, sum ``total``, minimising max_n m_n t_n (with
    ``fixed``: max_n a_n + m_n t_n, a_n rank n's seconds per step that no share changes).

    T* is the smallest T with sum_n max(floor, floor(T / t_n)) >= total: bisected around
    the fluid optimum total / sum(1/t) (every count only grows with T) until the counts sum
    to the total, which they then do at T* too; where ties at T* keep a surplus, it is taken
    back from the ranks that finish last. Vectorised: a few dozen passes over N.
    """
    t = np.asarray(t, dtype=np.float64)
    n = t.size
    if floor * n > total:
        raise UsageError(f"a floor of {floor} micro-batches for {n} ranks exceeds {total}")
    if floor * n == total:
        return np.full(n, floor, dtype=np.int64)
    if fixed is not None and np.any(fixed):
        return shares_with_fixed(t, total, floor, np.asarray(fixed, dtype=np.float64))
    fluid = total / float((1.0 / t).sum())
    # at fluid + (floor + 1) t_max every rank has >= x_n; below fluid - t_max, at most x_n - 1
    high, low = fluid + float(t.max()) * (floor + 1), max(0.0, fluid - float(t.max()))
    total_by = counted_total(t, floor)
    if total_by(low) >= total:
        low = 0.0  # the floors alone reach the total there
    got = total_by(high)  # kept with high: each pass counts once, at mid
    for _ in range(100):
        if got == total or high - low <= high * 1e-15:
            break  # equal: counts(T*) = counts(high), as counts only grow with T
        mid = 0.5 * (low + high)
        at_mid = total_by(mid)
        if at_mid >= total:
            high, got = mid, at_mid
        else:
            low = mid
    shares = counts(high, t, floor)
    return trimmed(shares, t, int(shares.sum()) - total, floor)


#: ranks up to which :func:`counted_total` sums in Python rather than numpy
SCALAR_RANKS = 64


def counted_total(t: np.ndarray, floor: int) -> Callable[[float], int]:
    """sum_n :func:`counts` (deadline, t, floor)_n as a function of the deadline. For a few
    ranks a Python sum over floats: numpy's four calls on an N = 4 array cost more than the
    arithmetic, and the bisection makes ~100 of them a step, on every rank's critical path in
    ``train``; IEEE division and floor give the very same counts."""
    if t.size > SCALAR_RANKS or not (np.isfinite(t) & (t > 0)).all():
        return lambda deadline: int(counts(deadline, t, floor).sum())
    times = t.tolist()
    return lambda deadline: sum(max(floor, math.floor(deadline / x)) for x in times)


def counts(deadline: float | np.ndarray, t: np.ndarray, floor: int) -> np.ndarray:
    """Micro-batches each rank finishes by ``deadline`` (one, or one per rank), at least
    ``floor``."""
    counted = np.floor(deadline / t)
    np.maximum(counted, floor, out=counted)  # in place: N can be 10^6, bisected ~50 times
    return counted.astype(np.int64)


def shares_with_fixed(t: np.ndarray, total: int, floor: int, fixed: np.ndarray) -> np.ndarray:
    """:func:`optimal_shares` with a_n = ``fixed``: rank n finishes m_n by T when
    m_n <= (T - a_n) / t_n, so T* is bisected the same way, on [0, max a + the fixed-free
    bound] (off the training hot path: advise prices a job's shares with it once)."""
    fluid = total / float((1.0 / t).sum())
    low, high = 0.0, float(fixed.max()) + fluid + float(t.max()) * (floor + 1)
    for _ in range(200):
        if high - low <= high * 1e-15:
            break
        mid = 0.5 * (low + high)
        if int(counts(mid - fixed, t, floor).sum()) >= total:
            high = mid
        else:
            low = mid
    shares = counts(high - fixed, t, floor)
    return trimmed(shares, t, int(shares.sum()) - total, floor, fixed)


def trimmed(
    shares: np.ndarray, t: np.ndarray, surplus: int, floor: int, fixed: np.ndarray | float = 0.0
) -> np.ndarray:
    """Take ``surplus`` micro-batches back, one at a time from the rank finishing last."""
    shares = shares.copy()
    while surplus > 0:
        finish = np.where(shares > floor, fixed + shares * t, -np.inf)
        take = np.argsort(-finish, kind="stable")[:surplus]
        take = take[np.isfinite(finish[take])]
        shares[take] -= 1
        surplus -= take.size
    return shares


def on_nominal_units(times: np.ndarray, shares: np.ndarray, micro_batches: int) -> np.ndarray:
    """A round of uneven shares as a round of M units each, for DropCompute's Algorithm 2.

    Rank n's measured cumulative time over its c_n completed units (NaN after them) is read
    at M evenly spaced fractions of its share s_n: pseudo-unit u ends when rank n has done
    u s_n / M of its units (linear within a unit); a pseudo-unit past c_n is NaN, not done.
    The same array when every share is M.
    """
    times = np.asarray(times, dtype=np.float64)
    if times.shape[1] == micro_batches and bool((shares == micro_batches).all()):
        return times
    n = times.shape[0]
    done = np.count_nonzero(~np.isnan(times), axis=1)
    cumulative = np.concatenate([np.zeros((n, 1)), np.nancumsum(times, axis=1)], axis=1)
    out = np.full((n, micro_batches), np.nan)
    for rank in range(n):  # a composed rule's calibration rounds only, N small
        points = np.arange(1, micro_batches + 1) * shares[rank] / micro_batches
        valid = points <= done[rank] + 1e-9
        if not valid.any():
            continue
        grid = np.arange(done[rank] + 1)
        ends = np.interp(points[valid], grid, cumulative[rank, : done[rank] + 1])
        out[rank, : valid.sum()] = np.diff(ends, prepend=0.0)
    return out


# ---- builder ------------------------------------------------------------------------------
def build_rebalance(spec: Spec) -> Rebalance:
    """``rebalance[:warmup=STEPS][,window=STEPS][,hysteresis=GAIN][,floor=MICRO_BATCHES]
    [,then=dropcompute[,defer=BOOL][,DropCompute's options]]`` or ``rebalance:deal=demand``.

    ``then=dropcompute`` composes DropCompute's threshold (``threshold=auto`` by default)
    rather than adding a ``dropcompute=`` option: its own options then read as they do in
    ``dropcompute:...``, and the composition is one rule chained after another."""
    then = spec.get_str("then", "") or None
    if then is not None and then not in THEN:
        raise UsageError(f"{spec.text!r}: then={then!r} is unknown; use one of {', '.join(THEN)}")
    spec.require_known(REBALANCE_KEYS + (DROPCOMPUTE_KEYS if then else ()))
    if spec.has("defer") and then is None:
        raise UsageError(f"{spec.text!r}: defer= applies to then=dropcompute's cut; add it")
    deal = spec.get_str("deal", "shares")
    if deal not in DEAL_MODES:
        raise UsageError(
            f"{spec.text!r}: deal={deal!r} is unknown; use one of {', '.join(DEAL_MODES)}"
        )
    if deal == "demand":
        extra = sorted(key for key in spec.params if key != "deal")
        if extra:  # no shares to estimate, no threshold: the N M-th completion ends a step
            raise UsageError(
                f"{spec.text!r}: deal=demand deals no shares and has no threshold "
                f"(a step ends at its N M-th completed micro-batch); drop "
                + ", ".join(f"{key}=" for key in extra)
            )
    window = spec.get_int("window", 50, minimum=1)
    warmup = spec.get_int("warmup", min(10, window), minimum=1)
    return Rebalance(
        warmup=warmup,
        window=window,
        hysteresis=spec.get_float("hysteresis", 0.05, minimum=0.0),
        floor=spec.get_int("floor", 1, minimum=1),
        defer=_defer(spec),
        deal=deal,
        then=None if then is None else _dropcompute(spec),
        text=spec.text,
    )


def _defer(spec: Spec) -> bool:
    value = spec.get_str("defer", "false")
    if value not in ("true", "false"):
        raise UsageError(f"{spec.text!r}: defer={value!r}; use defer=true or defer=false")
    return value == "true"


def _dropcompute(spec: Spec) -> DropCompute:
    options = parse_options(spec, default="auto")
    if options["compensate"] in ("larger-batch", "resample"):
        raise UsageError(
            f"{spec.text!r}: compensate={options['compensate']} changes the micro-batches a "
            "rank computes, which rebalance's shares decide; use none or extra-steps"
        )
    return DropCompute(name="dropcompute", **options)
