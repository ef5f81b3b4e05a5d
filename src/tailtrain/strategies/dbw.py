"""Dynamic Backup Workers (DBW, Xu, Neglia & Sebastianelli 2020) and its blind variant B-DBW.

After the update of ``w_t`` the PS picks how many fresh gradients ``k_t`` to wait for, greedily
maximising the expected loss decrease per unit of time (DBW Eq. 19)::

    k_t = max(argmax_k G_hat_{k,t} / T_hat_k,
              (k_{t-1} + 1) * 1{F_hat_{t-1} > beta F_hat_{t-2} and k_{t-1} < n})

- ``G_hat`` is the gain of DBW Eqs. (9)-(16), built from the scalars every step reports
  (mean loss, sum_i ||g_i||^2, ||mean g||^2) and averaged over the last D iterations; B-DBW
  uses ``G = k`` instead (DBW §4).
- ``T_hat_k = E[T_{k,k}]`` comes from the constrained least squares of DBW Eq. (17) over the
  round-trip samples ``t_{h,i,t}`` (``strategies.time_estimator``), late workers' arrivals of
  older versions included.

``time-window=D`` (``dbw`` and ``b-dbw``; default 0, every sample) feeds Eq. (17) only the D
latest samples of each cell (h, i). Eq. (17) as written pools every sample since the start
(T_{h,k,t} = {t_{h,k,t'}, t' <= t}), so after a change of the round-trip times the estimate of
a cell sampled long before moves by one sample in hundreds: in DBW §4.3's slowdown (Fig. 9,
half the workers 5x slower from t = 160 s) T_hat_16 stays near the old 1 s and k_t keeps going
back to 16. Every caption of DBW §4 says "estimates computed over the last D = 5 iterations";
read for the round-trip times as each cell's last D samples (the last D iterations that
sampled it), T_hat_16 reaches 5 s after five slow rounds and stays there. A window of the
last D iterations for all cells at once would not do: a cell left unsampled for D iterations
falls back to Eq. (17)'s optimistic fill, so k = 16 would be retried every D + 1 steps. The
option leaves the default records unchanged. Eq. (19)'s guard compares two single-step losses,
so ``beta`` must lie above their step-to-step noise: the paper's 1.01 fits its 16 x 500-sample
MNIST losses, not 32-sample ones (about 5% apart), where ``beta=1.2`` keeps it for real rises.
``reproduce dbw-fig9`` measures both.

``lipschitz=pooled`` (``dbw``; default ``window``, Eq. 15) estimates L from Eq. (12) over every
iteration so far, as the sum of its numerators over the sum of its denominators, instead of
the mean of the last D values of L+. Eq. (5) makes L one constant of F, unlike ||grad F||^2
and V, which move with w_t and keep Eqs. (13)-(14)'s window. Each L+ divides the change of the
step's loss estimate F_hat_{t-1} - F_hat_t by eta^2 (||grad F||^2 + V/k); with 32-sample batches
that change is noise of a few 0.01 against a denominator near 5e-4, so on DBW §4.3's slowdown
(``logreg``) the mean of five L+ swings between about -80 and +110, every G_hat_k turns
negative whenever it is large, and Eq. (18) falls back to k = n (DBW as written spends 36% of
the updates from t = 260 s at k = 8). Summed, the decreases telescope to F_hat_first -
F_hat_t, so the loss noise enters twice instead of once per step; L_hat then stays below the
value (about 6 there) above which G_8 < G_16 / 5, and with ``time-window=5,beta=1.2`` DBW
keeps k = 8 after the slowdown as Fig. 9 shows (100% of those updates). The paper's window
suffices for its MNIST losses over 16 x 500 samples; the option leaves the default records
unchanged. ``reproduce dbw-fig9`` measures every combination.

DBW drops stale gradients. It runs push & interrupt by default, like every sync-family strategy
here; ``mode=psw`` gives DBW §4's push & wait ("we refer only to PsW", §2), where late workers'
arrivals also feed the time estimator. Start: ``k = n`` until every estimate the rule needs
exists (the time fit after the first update; for DBW also the Lipschitz estimate of Eq. 12,
after the second).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tailtrain.errors import UsageError
from tailtrain.spec import Spec
from tailtrain.strategies.base import (
    ArrivalColumns,
    Context,
    ServerPlan,
    StepStats,
    Strategy,
    SyncMode,
)
from tailtrain.strategies.kfamily import lr_scale, parse_lr_rule, parse_mode
from tailtrain.strategies.time_estimator import RoundTripTimes

DEFAULT_DBW_WINDOW = 5  # D = 5 in all of DBW §4's experiments
DEFAULT_TIME_WINDOW = 0  # Eq. (17) as written: every round-trip sample since the start
DEFAULT_BETA = 1.01  # DBW §3.3
WINDOWED, POOLED = "window", "pooled"  # the two readings of L_hat (``lipschitz=``)


# --- gain estimator, DBW Eqs. (10)-(16) -------------------------------------------------------


def variance_plus(grad_sq_sum: float, mean_grad_sq: float, k: int) -> float:
    """DBW Eq. (10): sum over coordinates of the unbiased variance of the k_t gradients.

    sum_l 1/(k-1) sum_j [g_j - g]_l^2 = (sum_j ||g_j||^2 - k ||g||^2) / (k - 1); NaN for k < 2.
    """
    if k < 2:
        return math.nan
    return max(grad_sq_sum - k * mean_grad_sq, 0.0) / (k - 1)  # max: round-off only


def grad_norm_plus(mean_grad_sq: float, variance: float, k: int) -> float:
    """DBW Eq. (11): ||grad F(w_t)||^2 ~ max(||g_t||^2 - V/k_t, 0)."""
    return max(mean_grad_sq - variance / k, 0.0)


def lipschitz_terms(
    eta: float, grad_norm: float, variance: float, k: int, decrease: float
) -> tuple[float, float]:
    """Numerator and denominator of DBW Eq. (12); the denominator is NaN if not > 0."""
    denominator = eta**2 * (grad_norm + variance / k)
    if not denominator > 0:
        return math.nan, math.nan
    return 2.0 * (eta * grad_norm - decrease), denominator


def lipschitz_plus(eta: float, grad_norm: float, variance: float, k: int, decrease: float) -> float:
    """DBW Eq. (12): L from the observed decrease F_hat_{t-1} - F_hat_t of iteration t-1.

    ``eta``, ``grad_norm``, ``variance`` and ``k`` are iteration t-1's; NaN if undefined.
    """
    numerator, denominator = lipschitz_terms(eta, grad_norm, variance, k, decrease)
    return numerator / denominator


def gain(
    k: np.ndarray, eta: np.ndarray, lipschitz: float, grad_norm: float, variance: float
) -> np.ndarray:
    """DBW Eq. (16) (Eq. 9 with the estimates): expected loss decrease when waiting for k.

    A Lipschitz constant is >= 0; a negative estimate is noise and would reward small k.
    """
    half = max(lipschitz, 0.0) * eta**2 / 2.0
    return (eta - half) * grad_norm - half * variance / k


@dataclass(frozen=True)
class Iterate:
    """The a-posteriori (+) estimates of one iteration, needed by Eq. (12) one step later."""

    loss: float
    variance: float
    grad_norm: float
    k: int
    eta: float


@dataclass(frozen=True)
class GainEstimates:
    """The last D values of Eqs. (10), (11) and (12) (fewer while t <= D).

    ``pooled``: L_hat is Eq. (12) over every iteration so far, the sum of its numerators over
    the sum of its denominators, instead of Eq. (15)'s mean of the last D (see the module doc).
    """

    window: int
    variances: tuple[float, ...] = ()
    grad_norms: tuple[float, ...] = ()
    lipschitz: tuple[float, ...] = ()
    last: Iterate | None = None
    pooled: bool = False
    lipschitz_numerator: float = 0.0  # sums of Eq. (12)'s terms since the start (pooled)
    lipschitz_denominator: float = 0.0

    def observe(
        self, loss: float, grad_sq_sum: float, mean_grad_sq: float, k: int, eta: float
    ) -> GainEstimates:
        """Add iteration t's estimates. With k_t = 1 Eq. (10) is undefined, so Eqs. (11)-(12)
        use the windowed variance (Eq. 13) in its place; NaN statistics break the chain."""
        if not all(map(math.isfinite, (loss, grad_sq_sum, mean_grad_sq, eta))):
            return replace(self, last=None)
        v_plus = variance_plus(grad_sq_sum, mean_grad_sq, k)
        variance = v_plus if math.isfinite(v_plus) else self.mean(self.variances)
        norm = grad_norm_plus(mean_grad_sq, variance, k) if math.isfinite(variance) else math.nan
        numerator = denominator = math.nan
        p = self.last
        if p is not None and math.isfinite(p.grad_norm):
            numerator, denominator = lipschitz_terms(
                p.eta, p.grad_norm, p.variance, p.k, p.loss - loss
            )
        pooled = math.isfinite(denominator)
        return GainEstimates(
            self.window,
            self.push(self.variances, v_plus),
            self.push(self.grad_norms, norm),
            self.push(self.lipschitz, numerator / denominator),
            Iterate(loss, variance, norm, k, eta),
            self.pooled,
            self.lipschitz_numerator + (numerator if pooled else 0.0),
            self.lipschitz_denominator + (denominator if pooled else 0.0),
        )

    def push(self, values: tuple[float, ...], value: float) -> tuple[float, ...]:
        return (*values, value)[-self.window :] if math.isfinite(value) else values

    @staticmethod
    def mean(values: tuple[float, ...]) -> float:
        return float(np.mean(values)) if values else math.nan

    @property
    def ready(self) -> bool:
        return bool(self.variances and self.grad_norms and self.lipschitz)

    @property
    def lipschitz_estimate(self) -> float:
        """L_hat_t: Eq. (15), or with ``pooled`` Eq. (12) over every iteration so far."""
        if self.pooled:
            if not self.lipschitz_denominator > 0:
                return math.nan
            return self.lipschitz_numerator / self.lipschitz_denominator
        return self.mean(self.lipschitz)

    def gains(self, k: np.ndarray, eta: np.ndarray) -> np.ndarray:
        """DBW Eq. (16) with the averages of Eqs. (13)-(15); call only when ``ready``."""
        variance, norm = self.mean(self.variances), self.mean(self.grad_norms)
        return gain(k, eta, self.lipschitz_estimate, norm, variance)


# --- choice rule, DBW Eqs. (18)-(19) ----------------------------------------------------------


def argmax_gain_rate(gains: np.ndarray, times: np.ndarray) -> int:
    """DBW Eq. (18): argmax_k G_k / T_k over k = 1..n; k = n when every gain is negative.

    Ties go to the largest k: at equal rate, more gradients give a less noisy step.
    """
    n = gains.size
    if np.all(gains < 0):
        return n
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = gains / times
    rate = np.where(np.isnan(rate), -np.inf, rate)
    return n - int(np.argmax(rate[::-1]))


def loss_guard(k: int, k_prev: int, n: int, loss: float, prev_loss: float, beta: float) -> int:
    """DBW Eq. (19): if F_hat grew by more than beta since the last iteration, k_t >= k_{t-1}+1."""
    if loss > beta * prev_loss and k_prev < n:
        return max(k, k_prev + 1)
    return k


# --- round-trip samples t_{h,i,t}, DBW §3.2 ---------------------------------------------------


@dataclass(frozen=True)
class OpenVersion:
    """A model version whose gradients may still arrive: when it was made and with which h."""

    version: int
    updated: float  # time of the update that produced it; NaN: first arrival's start (w_0)
    h: int  # k_{t-1}: gradients the PS waited for before this version (n for w_0)
    received: int = 0


def round_trip_samples(
    versions: tuple[OpenVersion, ...], cols: ArrivalColumns, n: int
) -> tuple[tuple[OpenVersion, ...], np.ndarray, np.ndarray, np.ndarray]:
    """Samples (h, i, t_{h,i}) from whole arrivals of open versions, in order of reception.

    The i-th gradient of a version counts for cell (h, i) whether or not it was used: late
    workers' arrivals give the samples with i > k (DBW §3.2).
    """
    whole = np.flatnonzero(~cols.partial)
    whole = whole[np.lexsort((cols.worker[whole], cols.finish[whole]))]
    by_version = {v.version: v for v in versions}
    h, i, t = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for version in np.unique(cols.version[whole]).tolist():
        if version not in by_version:
            continue  # older than the versions still tracked
        v = by_version[version]
        mine = whole[cols.version[whole] == version][: n - v.received]
        if mine.size == 0:
            continue
        updated = v.updated if math.isfinite(v.updated) else float(cols.start[mine].min())
        h.append(np.full(mine.size, v.h))
        i.append(v.received + np.arange(1, mine.size + 1))
        t.append(cols.finish[mine] - updated)
        by_version[version] = replace(v, updated=updated, received=v.received + mine.size)
    return tuple(by_version.values()), np.concatenate(h), np.concatenate(i), np.concatenate(t)


def open_versions(
    versions: tuple[OpenVersion, ...], made: OpenVersion, n: int
) -> tuple[OpenVersion, ...]:
    """Add the version the update made; forget versions that delivered all n gradients or
    are more than n updates old (a worker that late is treated as lost)."""
    keep = tuple(v for v in versions if v.received < n and v.version > made.version - n)
    return (*keep, made)


# --- the strategies -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DbwState:
    n: int
    lr: float
    k: int
    loss: float  # F_hat of the latest iteration (Eq. 19)
    gains: GainEstimates
    times: RoundTripTimes
    versions: tuple[OpenVersion, ...]


@dataclass(frozen=True)
class Dbw(Strategy):
    """DBW (``blind=False``) or B-DBW (``blind=True``: gain k, DBW §4)."""

    name: str
    window: int = DEFAULT_DBW_WINDOW
    beta: float = DEFAULT_BETA
    #: PsI like every sync-family default here, so `dbw` and `k-sync:k=K` differ only in
    #: how k is chosen; DBW §4 ran PsW (`mode=psw`) and reports similar results with PsI (§2)
    mode: SyncMode = SyncMode.PSI
    lr_rule: str = "fixed"
    blind: bool = False
    #: latest samples per cell (h, i) that Eq. (17) uses; 0: all (see the module doc)
    time_window: int = DEFAULT_TIME_WINDOW
    #: L_hat from Eq. (12) over every iteration so far instead of Eq. (15)'s last D
    pooled_lipschitz: bool = False

    def init(self, ctx: Context) -> DbwState:
        n = ctx.n_workers
        first = OpenVersion(0, math.nan, n)
        times = RoundTripTimes.empty(n, self.time_window)
        gains = GainEstimates(self.window, pooled=self.pooled_lipschitz)
        return DbwState(n, ctx.lr, n, math.nan, gains, times, (first,))

    def plan(self, state: DbwState) -> ServerPlan:
        scale = lr_scale(self.lr_rule, state.k, state.n)
        return ServerPlan(k=state.k, mode=self.mode, accept_stale=False, lr_scale=scale)

    def adapt(self, state: DbwState, stats: StepStats) -> DbwState:
        return self.observe(state, stats, used=stats.k, waited_for=state.k)

    def observe(self, state: DbwState, stats: StepStats, used: int, waited_for: int) -> DbwState:
        """Round-trip samples, the Eq. (17) fit, the gain estimates (Eqs. 10-16) and Eq. (19).

        ``used`` gradients entered the update; the new version's round waited for
        ``waited_for`` (the h of its samples t_{h,i}).
        """
        versions, h, i, t = round_trip_samples(state.versions, stats.arrivals, state.n)
        opened = OpenVersion(stats.version, stats.time, waited_for)
        versions = open_versions(versions, opened, state.n)
        times = state.times.add(h, i, t).solved()
        gains = state.gains
        if not self.blind:
            eta = state.lr * lr_scale(self.lr_rule, used, state.n)
            gains = gains.observe(stats.loss, stats.grad_sq_sum, stats.mean_grad_sq, used, eta)
        k = self.choose(state, gains, times)
        k = loss_guard(k, state.k, state.n, stats.loss, state.loss, self.beta)
        return DbwState(state.n, state.lr, k, stats.loss, gains, times, versions)

    def choose(self, state: DbwState, gains: GainEstimates, times: RoundTripTimes) -> int:
        """DBW Eq. (18), or k = n while an estimate it needs is missing."""
        ks = np.arange(1, state.n + 1)
        if not times.ready or not (self.blind or gains.ready):
            return state.n
        if self.blind:
            return argmax_gain_rate(ks.astype(float), times.iteration_times())
        eta = state.lr * np.broadcast_to(lr_scale(self.lr_rule, ks, state.n), ks.shape)
        return argmax_gain_rate(gains.gains(ks, eta), times.iteration_times())

    def describe(self) -> str:
        parts = [] if self.blind else [f"window={self.window}"]
        parts.append(f"beta={self.beta:g}")
        if self.mode is not SyncMode.PSI:
            parts.append(f"mode={self.mode.value}")
        if self.lr_rule != "fixed":
            parts.append(f"lr={self.lr_rule}")
        if self.time_window:
            parts.append(f"time-window={self.time_window}")
        if self.pooled_lipschitz:
            parts.append(f"lipschitz={POOLED}")
        return f"{self.name}:{','.join(parts)}"


def build_dbw(spec: Spec) -> Dbw:
    spec.require_known(["window", "beta", "mode", "lr", "time-window", "lipschitz"])
    window = spec.get_int("window", DEFAULT_DBW_WINDOW, minimum=1)
    dbw = Dbw("dbw", window, *common_params(spec), time_window=time_window(spec))
    return replace(dbw, pooled_lipschitz=pooled_lipschitz(spec))


def build_b_dbw(spec: Spec) -> Dbw:
    spec.require_known(["beta", "mode", "lr", "time-window"])
    blind = Dbw("b-dbw", DEFAULT_DBW_WINDOW, *common_params(spec), blind=True)
    return replace(blind, time_window=time_window(spec))


def common_params(spec: Spec) -> tuple[float, SyncMode, str]:
    beta = spec.get_float("beta", DEFAULT_BETA, minimum=1.0)
    return beta, parse_mode(spec, SyncMode.PSI), parse_lr_rule(spec)


def pooled_lipschitz(spec: Spec) -> bool:
    """``lipschitz=window`` (Eq. 15, the default) or ``lipschitz=pooled`` (see the module doc)."""
    raw = spec.get_str("lipschitz", WINDOWED)
    if raw not in (WINDOWED, POOLED):
        raise UsageError(
            f"{spec.text!r}: lipschitz={raw!r} is unknown; use {WINDOWED} (Eq. 15, the last "
            f"D iterations) or {POOLED} (Eq. 12 over every iteration)"
        )
    return raw == POOLED


def time_window(spec: Spec) -> int:
    """``time-window=D``: each cell's latest D round-trip samples feed Eq. (17); 0: all."""
    return spec.get_int("time-window", DEFAULT_TIME_WINDOW, minimum=0)
