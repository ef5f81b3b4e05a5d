"""Round-trip-time estimator of DBW §3.2: the constrained least squares of DBW Eq. (17).

``t_{h,i,t}`` is the time from the update of ``w_t`` to the reception of the i-th gradient of
``w_t`` when the PS waited for ``h`` gradients at iteration t-1; its samples are pooled per cell
(h, i). DBW Eq. (17) estimates every ``E[T_{h,k}]`` at once by least squares under three families
of inequalities::

    x[h,k]   <= x[h,k+1]      more arrivals take longer
    x[h+1,k] <= x[h,k]        more idle workers at the start make arrivals sooner
    x[k,k]   <= x[k+1,k+1]    waiting for more workers every time makes iterations longer

Up to a constant the objective is ``sum_c counts_c * (mean_c - x_c)^2``: a weighted isotonic
regression on the partial order those inequalities generate. Cells without samples carry no
weight, so the problem is solved over the sampled cells only, under the order the grid induces
on them (its cover relations, from the closed form in :func:`precedes`). We solve the dual,
which is a bound-constrained least squares (a non-negative multiplier per cover relation)::

    minimise_{lam >= 0} 1/2 || W^{-1/2} A^T lam - W^{1/2} y ||^2,   x = y - W^{-1} A^T lam

with L-BFGS-B, warm-started from the previous multipliers, over a working set of relations that
constraint generation grows until none is violated (most relations are slack). Then we polish:
cells joined by an active relation form a block whose exact value is its weighted mean (the
standard last step of isotonic regression), kept when the duality gap certifies it. Finally
every cell of the n x n grid gets the smallest value consistent with the constraints and the
sampled cells (:func:`lower_fill`), which also makes the result satisfy all three families
exactly. Unsampled cells thus get optimistic (lowest consistent) times, the benefit the paper
notes: a k never tried still has an estimate (DBW Fig. 3).

At scale (n in the thousands) nothing here is O(n^2) per step: samples are pooled per sampled
row, the fit is kept on the sampled cells only, DBW reads the fill's diagonal from its closed
form (:func:`fill_diagonal`), the cover graph is reused until a cell gets its first sample, and
a step without samples does not re-solve. The full grid is built only when asked for.

scipy is imported by the two functions that solve (:func:`solve_dual`, :func:`polish`): every
rank imports this module with the strategies' registry, and a rank that never solves (any
strategy but DBW's) would pay about a second for scipy at each start and heal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np
from numpy.typing import ArrayLike
from threadpoolctl import ThreadpoolController

#: L-BFGS-B stops when the projected dual gradient is below this fraction of its initial size
DUAL_GTOL = 1e-9
#: the polished solution is kept when its duality gap is below this fraction of its objective
GAP_RTOL = 1e-6
#: rounds of constraint generation; each adds at least one violated relation
MAX_ROUNDS = 50
#: cap on the entries of one pruning tensor (cells x rows x rows booleans)
PRUNE_CHUNK = 1 << 22


def precedes(ha: ArrayLike, ka: ArrayLike, hb: ArrayLike, kb: ArrayLike) -> np.ndarray:
    """Whether Eq. (17) forces ``x[ha,ka] <= x[hb,kb]`` (1-based indices, numpy-broadcast).

    The three families generate: ``ka <= kb`` and either ``hb <= ha`` (along a row, then up a
    column) or, when (ha, ka) lies on or below the diagonal and (hb, kb) on or above it, a path
    through the diagonal chain: up to (ka, ka), along the diagonal to (kb, kb), up to (hb, kb).
    """
    ka, kb, ha, hb = map(np.asarray, (ka, kb, ha, hb))
    return (ka <= kb) & ((hb <= ha) | ((ka <= ha) & (hb <= kb)))


@dataclass(frozen=True)
class CoverGraph:
    """The order of Eq. (17) restricted to the sampled cells, as cover relations src -> dst."""

    n: int
    cells: np.ndarray  # sorted flat indices (h-1)*n + (k-1) of the sampled cells
    src: np.ndarray  # positions in ``cells``: x[cells[src]] <= x[cells[dst]]
    dst: np.ndarray

    @property
    def keys(self) -> np.ndarray:
        """One integer per relation, stable across graphs of the same n (for warm starts)."""
        return self.cells[self.src] * (self.n * self.n) + self.cells[self.dst]


def cover_graph(support: np.ndarray) -> CoverGraph:
    """Cover relations of the induced order on the cells where ``support`` (n x n) is true."""
    return cell_cover_graph(support.shape[0], np.flatnonzero(support.ravel()))


def cell_cover_graph(n: int, cells: np.ndarray) -> CoverGraph:
    """Cover relations of the induced order on ``cells`` (sorted flat indices of an n x n grid).

    Every cell above a sampled cell is above its first successor in some sampled row (rows are
    chains), so the candidates are one cell per sampled row; those above another candidate are
    implied and dropped.
    """
    h, k = cells // n + 1, cells % n + 1
    targets = row_successors(n, cells, h, k)
    keep = minimal_targets(targets, h, k)
    src, j = np.nonzero(keep)
    return CoverGraph(n, cells, src, targets[src, j])


def row_successors(n: int, cells: np.ndarray, h: np.ndarray, k: np.ndarray) -> np.ndarray:
    """For each sampled cell and sampled row, the first cell of that row above it, or -1."""
    rows = np.unique(h)
    targets = np.full((cells.size, rows.size), -1)
    for j, r in enumerate(rows):
        columns = k[h == r]  # ascending: cells are sorted
        # smallest column reachable in row r (closed form of ``precedes``); n + 1: none
        bridge = np.where(k <= h, np.maximum(k, r), n + 1)
        lo = np.where(r < h, k, np.where(r == h, k + 1, bridge))
        pos = np.searchsorted(columns, lo)
        ok = pos < columns.size
        targets[ok, j] = np.searchsorted(cells, (r - 1) * n + columns[pos[ok]] - 1)
    return targets


def minimal_targets(targets: np.ndarray, h: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Mask of the candidates that no other candidate of the same cell lies below."""
    valid = targets >= 0
    safe = np.maximum(targets, 0)
    th, tk = np.where(valid, h[safe], 0), np.where(valid, k[safe], 0)
    rows = targets.shape[1]
    other = ~np.eye(rows, dtype=bool)
    keep = valid.copy()
    step = max(1, PRUNE_CHUNK // max(1, rows * rows))
    for s in range(0, targets.shape[0], step):
        a, b, v = th[s : s + step], tk[s : s + step], valid[s : s + step]
        below = precedes(a[:, :, None], b[:, :, None], a[:, None, :], b[:, None, :])
        below &= v[:, :, None] & v[:, None, :] & other
        keep[s : s + step] &= ~below.any(axis=1)
    return keep


@dataclass(frozen=True)
class Eq17Fit:
    """A solution of Eq. (17) on the sampled cells, and the diagonal DBW reads from it.

    ``x[c]`` estimates E[T] at cell ``graph.cells[c]``; ``diagonal[k-1]`` is T_hat_k = E[T_{k,k}]
    of the least consistent fill (:func:`fill_diagonal`). The full n x n grid, :attr:`values`,
    is built only on request: DBW never needs it.
    """

    graph: CoverGraph
    x: np.ndarray
    dual: np.ndarray = field(repr=False)  # multiplier per cover relation, for warm starts
    diagonal: np.ndarray = field(repr=False)

    @property
    def values(self) -> np.ndarray:
        """``values[h-1, k-1]`` estimates E[T_{h,k}] for every cell (O(n^2): inspection only)."""
        n = self.graph.n
        if self.x.size == 0:
            return np.full((n, n), np.nan)
        return lower_fill(self.graph, self.x)


def solve_eq17(means: np.ndarray, counts: np.ndarray, warm: Eq17Fit | None = None) -> Eq17Fit:
    """DBW Eq. (17) for per-cell sample ``means`` and ``counts`` (n x n, counts 0 = no sample)."""
    n = means.shape[0]
    cells = np.flatnonzero(counts.ravel() > 0)
    same = warm is not None and warm.graph.n == n and np.array_equal(warm.graph.cells, cells)
    graph = warm.graph if same else cell_cover_graph(n, cells)
    return solve_cells(graph, means.ravel()[cells], counts.ravel()[cells].astype(float), warm)


def solve_cells(graph: CoverGraph, y: np.ndarray, w: np.ndarray, warm: Eq17Fit | None) -> Eq17Fit:
    """DBW Eq. (17) on the sampled cells ``graph.cells``: sample means ``y``, counts ``w``."""
    if graph.cells.size == 0:
        return Eq17Fit(graph, y, np.zeros(0), np.full(graph.n, np.nan))
    if np.all(y[graph.src] <= y[graph.dst]):
        # the empirical means already satisfy every constraint: they are the solution
        return Eq17Fit(graph, y, np.zeros(graph.src.size), fill_diagonal(graph, y))
    x, dual = isotonic_regression(graph.src, graph.dst, y, w, warm_dual(graph, warm))
    return Eq17Fit(graph, x, dual, fill_diagonal(graph, x))


def warm_dual(graph: CoverGraph, warm: Eq17Fit | None) -> np.ndarray:
    """The previous multipliers of the relations that still exist, 0 for new ones."""
    if warm is not None and warm.graph is graph:
        return warm.dual  # same relations (the usual case); never written to
    start = np.zeros(graph.src.size)
    if warm is None or warm.graph.n != graph.n or warm.dual.size == 0:
        return start
    old_keys, new_keys = warm.graph.keys, graph.keys
    order = np.argsort(old_keys)
    pos = np.minimum(np.searchsorted(old_keys, new_keys, sorter=order), old_keys.size - 1)
    hit = old_keys[order[pos]] == new_keys
    start[hit] = warm.dual[order[pos[hit]]]
    return start


def isotonic_regression(
    src: np.ndarray, dst: np.ndarray, y: np.ndarray, w: np.ndarray, start: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """min sum w (x - y)^2 s.t. x[src] <= x[dst], by constraint generation over the relations.

    Most relations are slack, so each round solves the dual over a working set only: the
    relations active before (warm start) or violated, then adds those the answer violates. The
    last answer satisfies every relation and is optimal for a relaxation, hence for the whole.
    """
    working = (start > 0) | (y[src] > y[dst])
    dual = start * working
    x = y
    for _ in range(MAX_ROUNDS):
        idx = np.flatnonzero(working)
        sub = solve_dual(src[idx], dst[idx], y, w, dual[idx])
        x = polish(src[idx], dst[idx], y, w, sub)
        dual = np.zeros(src.size)
        dual[idx] = sub
        grown = working | (x[src] > x[dst])
        if np.array_equal(grown, working):
            break
        working = grown
    return x, dual


def solve_dual(
    src: np.ndarray, dst: np.ndarray, y: np.ndarray, w: np.ndarray, start: np.ndarray
) -> np.ndarray:
    """Non-negative multipliers of the relations x[src] <= x[dst] (the dual), by L-BFGS-B.

    Columns are scaled to unit norm (lam = scale * mu), a diagonal preconditioner that keeps
    the iteration count low when sample counts differ by orders of magnitude.
    """
    import scipy.sparse as sp  # here, not at the top: module docstring
    from scipy.optimize import Bounds, minimize

    m = src.size
    inv = 1.0 / np.sqrt(w)
    scale = 1.0 / np.sqrt(inv[src] ** 2 + inv[dst] ** 2)
    vals = np.concatenate([inv[src] * scale, -inv[dst] * scale])
    cols = np.tile(np.arange(m), 2)
    mat = sp.csr_matrix((vals, (np.concatenate([src, dst]), cols)), shape=(y.size, m))
    mat_t = mat.T.tocsr()
    target = np.sqrt(w) * y

    def objective(mu: np.ndarray) -> tuple[float, np.ndarray]:
        r = mat @ mu - target
        return 0.5 * float(r @ r), mat_t @ r

    gtol = DUAL_GTOL * max(float(np.abs(mat_t @ target).max()), np.finfo(float).tiny)
    # L-BFGS-B runs BLAS on short vectors, where waking BLAS threads costs more than the work
    with blas_controller().limit(limits=1, user_api="blas"):
        result = minimize(
            objective,
            start / scale,
            jac=True,
            method="L-BFGS-B",
            bounds=Bounds(0.0, np.inf),
            options={"maxiter": 20 * m + 100, "ftol": 0.0, "gtol": gtol, "maxcor": 20},
        )
    return result.x * scale


@cache
def blas_controller() -> ThreadpoolController:
    """The loaded BLAS libraries; looking them up costs milliseconds, so it is done once."""
    return ThreadpoolController()


def polish(
    src: np.ndarray, dst: np.ndarray, y: np.ndarray, w: np.ndarray, dual: np.ndarray
) -> np.ndarray:
    """Exact values from the active set: cells joined by positive multipliers form blocks whose
    value is their weighted mean. Kept when feasible and certified by the duality gap;
    otherwise the primal point of the dual iterate, x = y - W^-1 A^T lam, is returned."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    size = y.size
    flow = np.bincount(src, dual, size) - np.bincount(dst, dual, size)
    approx = y - flow / w
    active = dual > 0
    links = sp.coo_matrix((np.ones(int(active.sum())), (src[active], dst[active])), (size, size))
    _, labels = connected_components(links, directed=False)
    x = (np.bincount(labels, w * y) / np.bincount(labels, w))[labels]
    primal = 0.5 * float(np.sum(w * (x - y) ** 2))
    lower = float(dual @ (y[src] - y[dst]) - 0.5 * np.sum(flow**2 / w))  # dual objective
    certified = primal - lower <= GAP_RTOL * max(primal, np.finfo(float).tiny)
    return x if certified and np.all(x[src] <= x[dst]) else approx


def lower_fill(graph: CoverGraph, x: np.ndarray) -> np.ndarray:
    """Every cell's value: the largest sampled value below it in the order (DBW Eq. 17's
    constraints), or the smallest sampled value where nothing sampled lies below.

    This is the least extension that satisfies all three families; on sampled cells it returns
    ``x`` itself when ``x`` is feasible and repairs round-off otherwise. It sweeps the grid in a
    topological order: columns left to right, each column from h = n up to h = 1.
    """
    n = graph.n
    own = np.full(n * n, -np.inf)
    own[graph.cells] = x
    own = own.reshape(n, n)
    out = np.empty((n, n))
    for j in range(n):
        base = own[:, j].copy()
        if j > 0:
            np.maximum(base, out[:, j - 1], out=base)  # row:      x[h,k-1] <= x[h,k]
            base[j] = max(base[j], out[j - 1, j - 1])  # diagonal: x[k-1,k-1] <= x[k,k]
        out[:, j] = np.maximum.accumulate(base[::-1])[::-1]  # column: x[h+1,k] <= x[h,k]
    return np.where(np.isfinite(out), out, np.min(x))


def fill_diagonal(graph: CoverGraph, x: np.ndarray) -> np.ndarray:
    """The diagonal of :func:`lower_fill` in O(cells + n): T_hat_k = E[T_{k,k}], DBW §3.2.

    By :func:`precedes`, cell (h, j) lies below (k, k) iff j <= min(h, k): the cells on or
    below the diagonal (j <= h) of columns 1..k. So T_hat_k is the running maximum over
    columns of each column's largest such value; maxima only, hence bit-identical to the fill.
    """
    n = graph.n
    h, j = graph.cells // n + 1, graph.cells % n + 1
    below = j <= h
    column = np.full(n, -np.inf)
    np.maximum.at(column, j[below] - 1, x[below])
    out = np.maximum.accumulate(column)
    return np.where(np.isfinite(out), out, np.min(x))


@dataclass(frozen=True)
class RoundTripTimes:
    """Pooled samples of ``t_{h,i}`` and their Eq. (17) fit; immutable, ``add`` returns a copy.

    Samples of a step fall in one row h = k_{t-1} (plus rows of late versions), so the sums and
    counts are kept per sampled row: ``rows[h] = (sums, counts)``, two length-n arrays. ``add``
    copies only the rows it touches and shares the others with the state it came from; shared
    arrays are read-only, so an old state never changes (a pure rule over explicit state). The
    state is O(sampled rows x n), not O(n^2). ``fit`` is refreshed by :meth:`solved` only when
    samples arrived since the last solve; the cover graph is rebuilt only when a cell got its
    first sample (``grown``).

    ``window`` D > 0 keeps only each cell's D latest samples (``recent[h]``: an n x D ring per
    row, slot ``count % D`` next), so that Eq. (17) follows a change of the round-trip times;
    ``rows`` then holds the sums and counts of those samples. 0: every sample since the start,
    the set T_{h,k,t} of Eq. (17) as written.
    """

    n: int
    rows: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    fit: Eq17Fit | None = None
    stale: bool = False
    grown: bool = False
    window: int = 0
    recent: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def empty(cls, n: int, window: int = 0) -> RoundTripTimes:
        return cls(n, window=window)

    def add(self, h: ArrayLike, i: ArrayLike, t: ArrayLike) -> RoundTripTimes:
        """Add samples ``t`` of cells (h, i) (1-based arrays)."""
        h, col, t = np.asarray(h), np.asarray(i) - 1, np.asarray(t, dtype=float)
        if t.size == 0:
            return self
        if self.window:
            return self.add_recent(h, col, t)
        rows, grown = dict(self.rows), self.grown
        for r in np.unique(h).tolist():  # distinct rows of one step: a handful
            mine = h == r
            old = rows.get(r)
            sums = np.zeros(self.n) if old is None else old[0].copy()
            counts = np.zeros(self.n, dtype=np.int64) if old is None else old[1].copy()
            grown = grown or bool(np.any(counts[col[mine]] == 0))
            np.add.at(sums, col[mine], t[mine])
            np.add.at(counts, col[mine], 1)
            sums.flags.writeable = counts.flags.writeable = False
            rows[r] = (sums, counts)
        return RoundTripTimes(self.n, rows, self.fit, stale=True, grown=grown)

    def add_recent(self, h: np.ndarray, col: np.ndarray, t: np.ndarray) -> RoundTripTimes:
        """:meth:`add` keeping each cell's ``window`` latest samples (``col``: 0-based)."""
        d = self.window
        rows, recent, grown = dict(self.rows), dict(self.recent), self.grown
        for r in np.unique(h).tolist():
            mine = np.flatnonzero(h == r)
            old = recent.get(r)
            ring = np.zeros((self.n, d)) if old is None else old[0].copy()
            seen = np.zeros(self.n, dtype=np.int64) if old is None else old[1].copy()
            grown = grown or bool(np.any(seen[col[mine]] == 0))
            # the j-th sample of a cell in this call goes to slot (seen + j) % D, in arrival
            # order; of more than D samples of one cell only the last D are kept
            order = mine[np.argsort(col[mine], kind="stable")]
            cells = col[order]
            first = np.searchsorted(cells, cells)
            rank = np.arange(cells.size) - first
            many = np.bincount(cells, minlength=self.n)[cells]
            keep = rank >= many - d
            ring[cells[keep], (seen[cells[keep]] + rank[keep]) % d] = t[order[keep]]
            seen += np.bincount(cells, minlength=self.n)
            ring.flags.writeable = seen.flags.writeable = False
            recent[r] = (ring, seen)
            sums, counts = ring.sum(axis=1), np.minimum(seen, d)
            sums.flags.writeable = counts.flags.writeable = False
            rows[r] = (sums, counts)
        return replace(self, rows=rows, recent=recent, stale=True, grown=grown)

    def solved(self) -> RoundTripTimes:
        if not self.stale and self.fit is not None:
            return self
        cells, sums, counts = self.pooled()
        reuse = self.fit is not None and not self.grown
        graph = self.fit.graph if reuse else cell_cover_graph(self.n, cells)
        fit = solve_cells(graph, sums / counts, counts.astype(float), self.fit)
        return replace(self, fit=fit, stale=False, grown=False)

    def pooled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The sampled cells (sorted flat indices (h-1)*n + i-1), their sums and counts."""
        cells, sums, counts = [np.zeros(0, np.int64)], [np.zeros(0)], [np.zeros(0, np.int64)]
        for r in sorted(self.rows):
            row_sums, row_counts = self.rows[r]
            sampled = np.flatnonzero(row_counts)
            cells.append((r - 1) * self.n + sampled)
            sums.append(row_sums[sampled])
            counts.append(row_counts[sampled])
        return np.concatenate(cells), np.concatenate(sums), np.concatenate(counts)

    @property
    def ready(self) -> bool:
        return self.fit is not None and self.fit.x.size > 0 and bool(np.isfinite(self.fit.x.min()))

    @property
    def sums(self) -> np.ndarray:
        """Per-cell sums as an n x n array (a fresh copy, for inspection)."""
        return self.dense(0, float)

    @property
    def counts(self) -> np.ndarray:
        """Per-cell sample counts as an n x n array (a fresh copy, for inspection)."""
        return self.dense(1, np.int64)

    def dense(self, which: int, dtype: type) -> np.ndarray:
        out = np.zeros((self.n, self.n), dtype=dtype)
        for r, row in self.rows.items():
            out[r - 1] = row[which]
        return out

    def expected(self) -> np.ndarray:
        """``E[T_{h,k}]`` estimates, ``[h-1, k-1]`` indexed; NaN before any sample. O(n^2)."""
        if self.fit is None:
            return np.full((self.n, self.n), np.nan)
        return self.fit.values

    def iteration_times(self) -> np.ndarray:
        """``T_hat_k = E[T_{k,k}]`` for k = 1..n (DBW §3.2, footnote 5); NaN before a fit."""
        if self.fit is None:
            return np.full(self.n, np.nan)
        return self.fit.diagonal.copy()
