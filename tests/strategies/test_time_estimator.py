"""DBW Eq. (17): the constrained least-squares estimator of E[T_{h,k}]."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize, nnls
from threadpoolctl import threadpool_limits

from tailtrain.strategies.time_estimator import (
    RoundTripTimes,
    cover_graph,
    precedes,
    solve_eq17,
)


def family_edges(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The three inequality families of Eq. (17) as flat (lower, upper) index pairs, 0-based."""
    h, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    flat = h * n + k
    rows = (flat[:, :-1].ravel(), flat[:, 1:].ravel())  # x[h,k] <= x[h,k+1]
    cols = (flat[1:, :].ravel(), flat[:-1, :].ravel())  # x[h+1,k] <= x[h,k]
    diag = (np.diagonal(flat)[:-1], np.diagonal(flat)[1:])  # x[k,k] <= x[k+1,k+1]
    return tuple(np.concatenate(p) for p in zip(rows, cols, diag, strict=True))


def closure(size: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Reflexive-transitive closure of the relations lo -> hi, by repeated squaring."""
    reach = np.eye(size, dtype=np.int64)
    reach[lo, hi] = 1
    for _ in range(int(np.ceil(np.log2(max(size, 2)))) + 1):
        reach = np.minimum(reach @ reach, 1)
    return reach.astype(bool)


def assert_feasible(values: np.ndarray) -> None:
    lo, hi = family_edges(values.shape[0])
    flat = values.ravel()
    assert np.all(flat[lo] <= flat[hi]), np.max(flat[lo] - flat[hi])


def objective(values: np.ndarray, means: np.ndarray, counts: np.ndarray) -> float:
    return float(np.sum(counts * (values - means) ** 2))


def slsqp_reference(means: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Eq. (17) over all n^2 cells and the paper's three families, by SLSQP (independent)."""
    n = means.shape[0]
    lo, hi = family_edges(n)
    w, y = counts.ravel() / counts.sum(), means.ravel()
    a = np.zeros((lo.size, n * n))
    a[np.arange(lo.size), lo], a[np.arange(lo.size), hi] = -1.0, 1.0
    with threadpool_limits(1, user_api="blas"):  # tiny problems: BLAS threads only slow down
        result = minimize(
            lambda x: (float(np.sum(w * (x - y) ** 2)), 2 * w * (x - y)),
            np.full(n * n, float(w @ y)),  # a constant matrix is feasible
            jac=True,
            method="SLSQP",
            constraints=[{"type": "ineq", "fun": lambda x: a @ x, "jac": lambda x: a}],
            options={"maxiter": 1000, "ftol": 1e-12},
        )
    # status 8: no descent direction left, i.e. converged as far as SLSQP can tell
    assert result.status in (0, 8) and np.all(a @ result.x >= -1e-9), result.message
    return result.x.reshape(n, n)


def nnls_reference(means: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The exact optimum on the sampled cells: the dual NNLS over the cover relations."""
    graph = cover_graph(counts > 0)
    y, w = means.ravel()[graph.cells], counts.ravel()[graph.cells].astype(float)
    m = graph.src.size
    mat = np.zeros((y.size, m))
    mat[graph.src, np.arange(m)] = 1 / np.sqrt(w[graph.src])
    mat[graph.dst, np.arange(m)] = -1 / np.sqrt(w[graph.dst])
    dual = nnls(mat, np.sqrt(w) * y, maxiter=50 * m + 50)[0] if m else np.zeros(0)
    out = np.full(means.shape, np.nan)
    out.flat[graph.cells] = y - (mat @ dual) / np.sqrt(w)
    return out


@st.composite
def samples(draw, max_n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(1, max_n))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 4, size=(n, n)) * (rng.random((n, n)) < draw(st.floats(0.2, 1.0)))
    counts.flat[rng.integers(n * n)] += 1  # at least one sample
    means = np.round(rng.exponential(size=(n, n)), 3)  # ties are common: rounded values
    return means, counts


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_closed_form_order_is_the_closure_of_the_three_families(n):
    reach = closure(n * n, *family_edges(n))
    h, k = np.divmod(np.arange(n * n), n)
    closed = precedes(h[:, None] + 1, k[:, None] + 1, h[None, :] + 1, k[None, :] + 1)
    assert np.array_equal(reach, closed)


@settings(max_examples=60, deadline=None)
@given(samples())
def test_solution_satisfies_all_three_families_and_is_optimal(problem):
    means, counts = problem
    fit = solve_eq17(means, counts)
    assert_feasible(fit.values)
    slsqp = slsqp_reference(means, counts)
    # SLSQP is only as accurate as its ftol: ours must be at least as good up to that
    tol = 1e-9 * counts.sum() * (1.0 + means.max() ** 2)
    assert objective(fit.values, means, counts) <= objective(slsqp, means, counts) + tol
    sampled = counts > 0
    exact = nnls_reference(means, counts)
    np.testing.assert_allclose(fit.values[sampled], exact[sampled], rtol=0, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(samples())
def test_means_that_already_satisfy_the_constraints_are_returned_unchanged(problem):
    means, counts = problem
    feasible = solve_eq17(means, counts).values  # any feasible matrix, ties included
    rng = np.random.default_rng(int(counts.sum()))
    new_counts = rng.integers(1, 5, size=counts.shape) * (rng.random(counts.shape) < 0.7)
    new_counts.flat[0] += 1
    fit = solve_eq17(feasible, new_counts)
    sampled = new_counts > 0
    assert np.array_equal(fit.values[sampled], feasible[sampled])
    assert np.all(fit.dual == 0)


@settings(max_examples=60, deadline=None)
@given(samples(max_n=8))
def test_diagonal_closed_form_is_the_diagonal_of_the_full_fill(problem):
    means, counts = problem
    fit = solve_eq17(means, counts)
    assert np.array_equal(fit.diagonal, np.diagonal(fit.values))


def test_add_copies_only_the_rows_it_touches_and_never_writes_shared_ones():
    times = RoundTripTimes.empty(4).add(np.array([2, 3]), np.array([1, 4]), np.array([1.0, 2.0]))
    row2, row3 = times.rows[2], times.rows[3]
    later = times.add(np.array([3, 3]), np.array([4, 2]), np.array([5.0, 1.0]))
    assert later.rows[2] is row2  # shared, not copied
    assert times.rows[3] is row3 and row3[0].tolist() == [0, 0, 0, 2.0]  # the old state is intact
    assert later.rows[3][0].tolist() == [0, 1.0, 0, 7.0] and later.rows[3][1].tolist() == [
        0,
        1,
        0,
        2,
    ]
    assert later.grown and not later.rows[3][0].flags.writeable
    with pytest.raises(ValueError):
        row2[0][0] = 9.0


def test_additive_feasible_means_are_their_own_estimate():
    rng = np.random.default_rng(3)
    n = 7
    v = np.cumsum(rng.exponential(size=n))  # x decreases in h by v_h
    u = np.cumsum(np.diff(v, prepend=0.0) + rng.exponential(size=n))  # and the diagonal rises
    means = u[None, :] - v[:, None]
    counts = rng.integers(1, 9, size=(n, n))
    np.testing.assert_array_equal(solve_eq17(means, counts).values, means)


def test_known_violation_is_pooled_to_the_weighted_mean():
    # one row (h = 2 of n = 2): x[2,1] = 3 (3 samples) above x[2,2] = 1 (1 sample) violates
    # the row family; the least-squares answer pools them: (3*3 + 1*1) / 4 = 2.5
    means = np.array([[0.0, 0.0], [3.0, 1.0]])
    counts = np.array([[0, 0], [3, 1]])
    values = solve_eq17(means, counts).values
    assert values[1, 0] == pytest.approx(2.5, abs=1e-12)
    assert values[1, 1] == pytest.approx(2.5, abs=1e-12)
    assert_feasible(values)


def test_unsampled_cells_get_the_least_consistent_value():
    # only row h = 3 of n = 3 is sampled; T[1,1] and T[2,2] may be anything >= x[3,1], x[3,2]
    means = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 2.0, 4.0]])
    counts = np.array([[0, 0, 0], [0, 0, 0], [5, 5, 5]])
    values = solve_eq17(means, counts).values
    np.testing.assert_array_equal(np.diagonal(values), [1.0, 2.0, 4.0])
    np.testing.assert_array_equal(values[0], [1.0, 2.0, 4.0])
    assert_feasible(values)


def test_cover_graph_generates_exactly_the_induced_order():
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(1, 8))
        support = rng.random((n, n)) < rng.uniform(0.1, 1.0)
        graph = cover_graph(support)
        reach = closure(graph.cells.size, graph.src, graph.dst)
        h, k = graph.cells // n + 1, graph.cells % n + 1
        induced = precedes(h[:, None], k[:, None], h[None, :], k[None, :])
        assert np.array_equal(reach, induced)


def test_warm_start_gives_the_cold_answer():
    rng = np.random.default_rng(11)
    n = 12
    times = RoundTripTimes.empty(n)
    for step in range(30):
        h = np.full(n, int(rng.integers(1, n + 1)))
        t = np.sort(0.3 + 0.7 * rng.exponential(size=n))
        times = times.add(h, np.arange(1, n + 1), t).solved()
        cold = solve_eq17(times.sums / np.maximum(times.counts, 1), times.counts)
        np.testing.assert_allclose(times.expected(), cold.values, rtol=0, atol=1e-9, err_msg=step)
        assert_feasible(times.expected())


def test_round_trip_times_pool_samples_and_solve_only_when_new_ones_came():
    times = RoundTripTimes.empty(3)
    assert not times.ready
    assert np.all(np.isnan(times.iteration_times()))
    times = times.add(np.array([3, 3, 3, 3]), np.array([1, 2, 3, 1]), np.array([1.0, 2, 3, 2]))
    assert times.stale
    solved = times.solved()
    assert solved.ready and solved.solved() is solved
    assert solved.counts[2].tolist() == [2, 1, 1]
    np.testing.assert_array_equal(solved.expected()[2], [1.5, 2.0, 3.0])
    np.testing.assert_array_equal(solved.iteration_times(), [1.5, 2.0, 3.0])
    assert times.counts[2, 0] == 2 and RoundTripTimes.empty(3).counts.sum() == 0


def test_a_time_window_keeps_each_cells_latest_samples():
    times = RoundTripTimes.empty(3, window=2)
    times = times.add(np.array([3, 3, 3, 3]), np.array([1, 2, 3, 1]), np.array([1.0, 2, 3, 2]))
    assert times.counts[2].tolist() == [2, 1, 1] and times.sums[2].tolist() == [3.0, 2, 3]
    # five samples of cell (3, 1) so far: only the last two count, within one call too
    times = times.add(np.array([3, 3, 3]), np.array([1, 1, 1]), np.array([10.0, 20, 30]))
    assert times.counts[2].tolist() == [2, 1, 1] and times.sums[2].tolist() == [50.0, 2, 3]
    times = times.add(np.array([3, 2]), np.array([1, 1]), np.array([40.0, 7]))
    assert times.sums[2, 0] == 70.0 and times.counts[1, 0] == 1
    assert times.solved().ready and not times.solved().stale
    # without a window every sample counts
    whole = RoundTripTimes.empty(3).add(np.array([3, 3, 3]), np.array([1, 1, 1]), np.ones(3))
    assert whole.counts[2, 0] == 3
