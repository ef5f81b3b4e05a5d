"""``trace:path=FILE``: reading, the empirical model, bootstrap sampling and bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tailtrain.delays import DelayProcess, TraceDelay, parse_delay, read_trace
from tailtrain.errors import UsageError


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def per_iteration_trace(tmp_path: Path, seconds: np.ndarray) -> Path:
    rows = [f"{i // 4},{i % 4},{float(s)!r}" for i, s in enumerate(seconds)]
    return write(tmp_path, "iteration,worker,seconds\n" + "\n".join(rows) + "\n")


@pytest.fixture
def seconds() -> np.ndarray:
    return np.random.default_rng(0).gamma(2.0, 0.3, size=400).round(4)


def test_empirical_moments_cdf_and_quantile(tmp_path: Path, seconds: np.ndarray) -> None:
    model = parse_delay(f"trace:path={per_iteration_trace(tmp_path, seconds)}")
    assert isinstance(model, TraceDelay) and not model.exact and model.method == "empirical"
    assert model.mean == pytest.approx(seconds.mean()) and model.var == pytest.approx(seconds.var())
    x = np.linspace(0, 3, 61)
    np.testing.assert_allclose(model.cdf(x), (seconds[:, None] <= x).mean(axis=0))
    np.testing.assert_allclose(
        model.quantile([0.25, 0.5]), np.quantile(seconds, [0.25, 0.5], method="inverted_cdf")
    )
    assert model.support == (seconds.min(), seconds.max()) and not model.per_micro_batch


def test_bootstrap_draws_trace_values_with_their_frequencies(tmp_path, seconds, stat) -> None:
    model = parse_delay(f"trace:path={per_iteration_trace(tmp_path, seconds)}")
    samples = model.sample(np.random.default_rng(1), 100_000)
    assert np.isin(samples, seconds).all()
    assert stat.ecdf_distance(model, samples) <= stat.dkw_epsilon(samples.size)
    assert abs(samples.mean() - model.mean) <= stat.mean_tolerance(samples)


def test_micro_batch_column_is_optional_and_any_order(tmp_path: Path) -> None:
    path = write(tmp_path, "seconds,micro_batch,worker,iteration\n0.5,0,0,0\n0.7,1,0,0\n")
    trace = read_trace(path)
    assert trace.micro_batch.tolist() == [0, 1] and trace.seconds.tolist() == [0.5, 0.7]
    model = parse_delay(f"trace:path={path}")
    assert model.per_micro_batch
    assert DelayProcess(model, None, 0, 2, 3).next_block(2).shape == (2, 2, 3)


def test_trace_granularity_must_match_the_scenario(tmp_path: Path, seconds) -> None:
    per_iteration = per_iteration_trace(tmp_path, seconds)
    with pytest.raises(UsageError, match="has no micro_batch column but the scenario has 12"):
        DelayProcess(f"trace:path={per_iteration}", None, 0, 4, 12)
    per_mb = write(tmp_path, "iteration,worker,micro_batch,seconds\n0,0,0,0.1\n", "mb.csv")
    with pytest.raises(UsageError, match="has micro_batch column but the scenario has no"):
        DelayProcess(f"const:value=1+trace:path={per_mb}", None, 0, 4)


def test_trace_in_a_sum_makes_the_sum_empirical(tmp_path: Path, seconds) -> None:
    model = parse_delay(f"const:value=1+trace:path={per_iteration_trace(tmp_path, seconds)}")
    assert not model.exact and model.method == "empirical"
    assert model.mean == pytest.approx(1 + seconds.mean())
    assert model.cdf(1 + seconds.max()) == 1.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "is empty"),
        ("iteration,worker,seconds\n", "no rows"),
        ("iteration,worker\n0,0\n", "missing column(s) seconds"),
        ("iteration,worker,seconds,gpu\n0,0,1,0\n", "unknown column(s) gpu"),
        ("iteration,worker,seconds,seconds\n0,0,1,1\n", "repeated column(s) seconds"),
        ("iteration,worker,seconds\n0,0,0.5\n1,0,slow\n", "line 3: 'slow' is not a number"),
        ("iteration,worker,seconds\n0,0,0.5\n1,0\n", "line 3 has 2 fields"),
        ("iteration,worker,seconds\n0,0,0.5\n1,0,-0.2\n", "seconds=-0.2 must be a finite"),
        ("iteration,worker,seconds\n0,0,nan\n", "seconds=nan must be a finite"),
        ("iteration,worker,seconds\n0,1.5,0.3\n", "worker=1.5 must be an integer"),
        ("iteration,worker,seconds\n-1,0,0.3\n", "iteration=-1 must be an integer"),
    ],
)
def test_bad_trace_file_is_a_one_line_usage_error(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as caught:
        parse_delay(f"trace:path={path}")
    assert needle in str(caught.value) and "\n" not in str(caught.value)
    assert str(path) in str(caught.value)


def test_missing_and_unreadable_trace_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"cannot read trace file .*No such file"):
        parse_delay(f"trace:path={tmp_path / 'nope.csv'}")
    with pytest.raises(UsageError, match="cannot read trace file"):
        parse_delay(f"trace:path={tmp_path}")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError, match="trace file"):
        parse_delay(f"trace:path={binary}")
