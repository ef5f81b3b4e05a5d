"""The law of a replica group's micro-batch (``delays.groups``): the max of G i.i.d. draws of
a delay plus the within-group collectives' cost c.

    F_G(x) = F(x - c)^G,   Q_G(u) = Q(u^(1/G)) + c,   E = E[X_{G:G}] + c

(the max of G i.i.d. draws is the G-th order statistic of G: ``theory.order_stats``). With it
``predict``'s closed forms and quadratures (order statistics, DropCompute's partial sums)
apply to groups unchanged: a hybrid-sharded job of N ranks is N/G workers of this law.
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import integrate, special

from tailtrain.delays.base import DelayModel, FloatArray, Shape
from tailtrain.delays.groups import check_grouping, group_unit_times
from tailtrain.theory.order_stats import expected_order_stats
from tailtrain.theory.sums import exact_logs, quantile_at_sf


class GroupMax(DelayModel):
    """The law of a group's micro-batch: max of ``group_size`` i.i.d. draws of ``base`` plus
    ``cost``. cdf F(x - c)^G, quantile Q_F(u^(1/G)) + c, and E = E[X_{G:G}] + c by
    ``theory.order_stats``; the variance by quadrature of Q^2 against the density G v^(G-1)
    of the max's uniform (in logit coordinates, as ``theory.order_stats`` integrates)."""

    def __init__(self, base: DelayModel, group_size: int, cost: float = 0.0) -> None:
        check_grouping(group_size, group_size, cost)
        self.base, self.group_size, self.cost = base, int(group_size), float(cost)
        self.spec = f"max of {group_size} x ({base.spec}) + {cost:g}"

    def sample(self, rng: np.random.Generator, shape: Shape) -> NDArray[np.float64]:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        draws = self.base.sample(rng, (*shape, self.group_size))
        return group_unit_times(draws, self.group_size, self.cost, axis=-1)[..., 0]

    @property
    def per_worker(self) -> bool:
        return self.base.per_worker

    @property
    def exact(self) -> bool:
        return self.base.exact

    @property
    def method(self) -> str:
        return "numerical" if self.base.exact else "empirical"

    @property
    def support(self) -> tuple[float, float]:
        low, high = self.base.support
        return (low + self.cost, high + self.cost)

    @property
    def atoms(self) -> tuple[FloatArray, FloatArray]:
        """An atom a of X is one of the max at a + c, of mass F(a)^G - (F(a) - p_a)^G."""
        values, probs = self.base.atoms
        if not np.size(values):
            return np.empty(0), np.empty(0)
        top = np.asarray(self.base.cdf(values), dtype=float)
        below = np.clip(top - probs, 0.0, 1.0)
        return values + self.cost, top**self.group_size - below**self.group_size

    @cached_property
    def mean(self) -> float:
        if self.group_size == 1:
            return self.base.mean + self.cost
        if not math.isfinite(self.base.mean):
            return math.inf
        rng = np.random.default_rng(0)  # an empirical base: Monte Carlo (seeded)
        stats = expected_order_stats(self.base, self.group_size, [self.group_size], rng=rng)
        return float(stats.mean[0]) + self.cost

    @cached_property
    def var(self) -> float:
        if self.group_size == 1:
            return self.base.var
        if self.base.var == 0:
            return 0.0
        if not math.isfinite(self.base.var):
            return math.inf
        if not self.base.exact:
            draws = self.sample(np.random.default_rng(0), 200_000)
            return float(draws.var())
        g = self.group_size
        shift = self.mean - self.cost  # centred, for accuracy

        def integrand(s: float) -> float:
            u = special.expit(s)
            x = float(self.base.quantile(u)) - shift
            # density of U_{G:G} is G u^(G-1); du = u (1 - u) ds
            return x * x * g * u**g * (1 - u)

        value, _ = integrate.quad(integrand, -36.0, 36.0, limit=400)
        return float(value)

    def cdf(self, x: ArrayLike) -> NDArray[np.float64]:
        x = np.asarray(x, dtype=float) - self.cost
        return np.asarray(self.base.cdf(x), dtype=float) ** self.group_size

    def pdf(self, x: ArrayLike) -> NDArray[np.float64]:
        x = np.asarray(x, dtype=float) - self.cost
        g = self.group_size
        f = np.asarray(self.base.cdf(x), dtype=float)
        return g * f ** (g - 1) * np.asarray(self.base.pdf(x), dtype=float)

    def tail_logs(self, x: ArrayLike) -> tuple[FloatArray, FloatArray]:
        """log P(max > x) and log P(max <= x), from the base's own logs (``theory.sums``):
        G log F, and log(-expm1(G log F)) for the survival, which keeps its relative
        accuracy far out in the tail (1 - F^G in doubles is 0 below 1e-16)."""
        base_sf, base_cdf = exact_logs(self.base, np.asarray(x, dtype=float) - self.cost)
        base_sf, base_cdf = np.asarray(base_sf, dtype=float), np.asarray(base_cdf, dtype=float)
        # log F from the survival where it is small (the upper tail), else from log F
        tail = base_sf < -math.log(2)
        with np.errstate(divide="ignore", invalid="ignore"):
            from_sf = np.log1p(-np.exp(base_sf))
        log_cdf = self.group_size * np.where(tail, from_sf, base_cdf)
        with np.errstate(divide="ignore"):
            return np.log(-np.expm1(log_cdf)), log_cdf

    def isf(self, p: float) -> float:
        """The x with P(max > x) = p: the base's at p' with 1 - (1 - p')^G = p."""
        each = -math.expm1(math.log1p(-p) / self.group_size)
        return quantile_at_sf(self.base, each) + self.cost

    def quantile(self, q: ArrayLike) -> NDArray[np.float64]:
        q = np.clip(np.asarray(q, dtype=float), 0.0, 1.0)
        u = q ** (1.0 / self.group_size)
        # u^(1/G) is nearer 1 than u: keep a u < 1 below 1 (else the quantile is the top end)
        u = np.where((u >= 1.0) & (q < 1.0), np.nextafter(1.0, 0.0), u)
        return np.asarray(self.base.quantile(u), dtype=float) + self.cost
