"""``trace:path=FILE``: reading, the empirical model, per-worker replay, pooled bootstrap
sampling and its warning, worker mapping and bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tailtrain.delays import DelayProcess, TraceDelay, parse_delay, read_trace
from tailtrain.delays.process import trace_notes
from tailtrain.delays.trace import TRACE_FORMAT
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
    """``sample`` is the pooled bootstrap of the empirical law, whatever the sampling."""
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


@pytest.mark.parametrize("text", ["", "iteration,worker,secs\n0,0,1\n"])
def test_a_header_error_names_every_column_a_trace_may_have(tmp_path: Path, text: str) -> None:
    # the message is how a user learns the format: it names censored and noncompute, the
    # columns `tailtrain train` writes, as well as micro_batch
    with pytest.raises(UsageError) as caught:
        parse_delay(f"trace:path={write(tmp_path, text)}")
    assert TRACE_FORMAT in str(caught.value)
    assert "[,samples][,run]" in TRACE_FORMAT


def test_missing_and_unreadable_trace_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"cannot read trace file .*No such file"):
        parse_delay(f"trace:path={tmp_path / 'nope.csv'}")
    with pytest.raises(UsageError, match="cannot read trace file"):
        parse_delay(f"trace:path={tmp_path}")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError, match="trace file"):
        parse_delay(f"trace:path={binary}")


def shuffled_trace(tmp_path: Path, rows: list[tuple], header: str) -> Path:
    """Rows written in a random order: the replay order must come from the columns."""
    order = np.random.default_rng(7).permutation(len(rows))
    lines = [",".join(repr(v) for v in rows[i]) for i in order]
    return write(tmp_path, header + "\n" + "\n".join(lines) + "\n", "shuffled.csv")


def test_replay_follows_each_workers_recorded_order_and_cycles(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    lengths = {0: 5, 1: 3, 2: 7}  # unequal: each worker cycles on its own
    rows = [
        (i, w, round(float(rng.uniform(0.1, 2)), 6)) for w, n in lengths.items() for i in range(n)
    ]
    path = shuffled_trace(tmp_path, rows, "iteration,worker,seconds")
    process = DelayProcess(f"trace:path={path}", None, 0, 3)
    got = np.concatenate([process.next_block(4), process.next_block(13)])  # across calls
    for w, n in lengths.items():
        recorded = [s for i, v, s in sorted(rows) if v == w]
        np.testing.assert_array_equal(got[:, w], [recorded[j % n] for j in range(17)])


def test_replay_with_micro_batches_uses_the_workers_jth_iteration(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    # iterations 10, 20, 30 (not 0..2) with 3 micro-batches each, 2 workers
    rows = [
        (10 * (j + 1), w, m, round(float(rng.uniform(0.1, 1)), 6))
        for w in range(2)
        for j in range(3)
        for m in range(3)
    ]
    path = shuffled_trace(tmp_path, rows, "iteration,worker,micro_batch,seconds")
    got = DelayProcess(f"trace:path={path}", None, 0, 2, 3).next_block(5)
    for w in range(2):
        for j in range(5):
            iteration = 10 * (j % 3 + 1)
            want = [s for i, v, m, s in sorted(rows) if v == w and i == iteration]
            np.testing.assert_array_equal(got[j, w], want)


def test_more_workers_than_the_trace_map_w_mod_W_and_say_so(tmp_path: Path) -> None:
    rows = [(i, w, float(1 + w + i / 10)) for i in range(4) for w in range(2)]
    path = shuffled_trace(tmp_path, rows, "iteration,worker,seconds")
    process = DelayProcess(f"trace:path={path}", None, 0, 5)
    block = process.next_block(6)
    for w in range(5):
        want = [1 + w % 2 + (j % 4) / 10 for j in range(6)]
        np.testing.assert_allclose(block[:, w], want, rtol=0, atol=1e-12)
    assert "worker w replays trace worker w mod 2" in process.notes["trace_mapping"]
    assert "trace_warning" not in process.notes


def test_fewer_workers_than_the_trace_use_the_first_and_say_so(tmp_path: Path) -> None:
    rows = [(i, w, float(1 + w)) for i in range(3) for w in (3, 5, 8, 9)]  # ids, not 0..3
    path = shuffled_trace(tmp_path, rows, "iteration,worker,seconds")
    process = DelayProcess(f"trace:path={path}", None, 0, 2)
    np.testing.assert_array_equal(process.next_block(3), [[4.0, 6.0]] * 3)
    assert "the first 2 trace workers (in id order)" in process.notes["trace_mapping"]
    assert DelayProcess(f"trace:path={path}", None, 0, 4).notes == {}


def straggler_trace(tmp_path: Path, iterations: int = 60, workers: int = 4) -> Path:
    """Worker 0 always takes 5 s, the others U(1, 3) s: a persistent straggler."""
    rng = np.random.default_rng(11)
    rows = [
        (i, w, 5.0 if w == 0 else float(rng.uniform(1, 3)))
        for i in range(iterations)
        for w in range(workers)
    ]
    return write(
        tmp_path,
        "iteration,worker,seconds\n"
        + "\n".join(",".join(repr(v) for v in row) for row in rows)
        + "\n",
        "straggler.csv",
    )


def test_replayed_straggler_keeps_every_sync_iteration_at_5s(tmp_path: Path) -> None:
    path = straggler_trace(tmp_path)
    block = DelayProcess(f"trace:path={path}+const:value=0.1", None, 0, 4).next_block(150)
    np.testing.assert_allclose(block.max(axis=1), 5.1)
    pooled = DelayProcess(f"trace:path={path},sampling=pooled", None, 0, 4).next_block(150)
    assert pooled.max(axis=1).mean() < 4.6  # the bootstrap loses the straggler


def test_persistent_pattern_holds_the_replayed_iteration(tmp_path: Path) -> None:
    rows = [(i, w, float(10 * w + i + 1)) for i in range(5) for w in range(2)]
    path = shuffled_trace(tmp_path, rows, "iteration,worker,seconds")
    block = DelayProcess(f"trace:path={path}", "persistent:h=2", 0, 2).next_block(7)
    held = np.arange(7) // 2 % 5  # iteration t holds recorded iteration floor(t / h)
    np.testing.assert_array_equal(block, np.stack([held + 1, held + 11], axis=1))


def test_pooled_sampling_warns_only_on_persistent_differences(tmp_path: Path, seconds) -> None:
    straggler = parse_delay(f"trace:path={straggler_trace(tmp_path)},sampling=pooled")
    assert not straggler.per_worker
    warning = trace_notes(straggler, 4)["trace_warning"]
    assert "persistent per-worker differences" in warning and "slowest worker 0" in warning
    assert "\n" not in warning
    # i.i.d. workers (the gamma fixture dealt round-robin): nothing to warn about
    iid = parse_delay(f"trace:path={per_iteration_trace(tmp_path, seconds)},sampling=pooled")
    assert trace_notes(iid, 4) == {}
    # a tiny but real difference in a big trace is significant, yet too small to matter
    rng = np.random.default_rng(5)
    big = rng.gamma(2.0, 0.3, size=(4000, 4)) + np.array([0.05, 0, 0, 0])
    assert stats.kruskal(*big.T).pvalue < 1e-6  # significant, but 0.05 s is ~0.1 IQR
    small = parse_delay(f"trace:path={per_iteration_trace(tmp_path, big.ravel())},sampling=pooled")
    assert trace_notes(small, 4) == {}


def test_unknown_sampling_is_a_one_line_usage_error(tmp_path: Path, seconds) -> None:
    path = per_iteration_trace(tmp_path, seconds)
    with pytest.raises(UsageError, match="unknown sampling='bootstrap'; use sampling=per-worker"):
        parse_delay(f"trace:path={path},sampling=bootstrap")
    assert parse_delay(f"trace:path={path},sampling=per-worker").per_worker


def test_samples_and_runs_round_trip_and_a_replay_reads_the_last_run(tmp_path: Path) -> None:
    # a probe appends a second run to the same file: the replay must not mix the two
    from tailtrain.delays.trace import read_run, write_trace_rows

    path = tmp_path / "trace.csv"
    first = np.array([[0, 0, 0.1, 0.02, 32, 0], [0, 1, 0.3, 0.0, 32, 0]])
    second = np.array([[0, 0, 0.15, 0.01, 48, 1], [0, 1, 0.05, 0.11, 16, 1]])
    for rows in (first, second):
        write_trace_rows(path, rows, False, append=True, noncompute=True, samples=True, run=True)
    assert path.read_text().splitlines()[0] == "iteration,worker,seconds,noncompute,samples,run"
    whole = read_trace(path)
    assert whole.runs == [0, 1] and whole.samples.tolist() == [32, 32, 48, 16]
    assert read_run(path).seconds.tolist() == [0.15, 0.05]
    assert read_run(path, 0).samples.tolist() == [32, 32]
    assert parse_delay(f"trace:path={path}").trace.samples.tolist() == [48, 16]
    assert parse_delay(f"trace:path={path},run=0").trace.seconds.tolist() == [0.1, 0.3]
    with pytest.raises(UsageError, match=r"holds runs \[0, 1\], not run 3"):
        parse_delay(f"trace:path={path},run=3")


def test_samples_and_run_must_be_integers(tmp_path: Path) -> None:
    path = write(tmp_path, "iteration,worker,seconds,samples\n0,0,0.1,2.5\n")
    with pytest.raises(UsageError, match=r"samples=2.5 must be an integer >= 0"):
        parse_delay(f"trace:path={path}")


def test_a_traces_units_are_a_computations_unless_it_says_they_slept(tmp_path: Path) -> None:
    """A threshold cannot stop a measured computation (``DelayModel.cuttable``): ``cut=no``
    says a trace's units were one, and so does ``train``'s machine row beside it when less
    than half their seconds were injected sleeps; a trace that says nothing keeps the
    simulator's sleeps. The other laws are sleeps; a sum is cut only if all its terms are."""
    path = per_iteration_trace(tmp_path, np.full(8, 0.1))
    assert parse_delay(f"trace:path={path}").cuttable
    assert not parse_delay(f"trace:path={path},cut=no").cuttable
    assert not parse_delay(f"trace:path={path},cut=no+const:value=0.1").cuttable
    assert parse_delay("exp:rate=2+const:value=0.1").cuttable
    row = '{"run": 0, "host": "h", "cores": 2, "local_ranks": 4, "load": [1.0]%s}\n'
    for asleep, cuttable in (("", True), (', "asleep": 0.98', True), (', "asleep": 0.5', True),
                             (', "asleep": 0.2', False), (', "asleep": 0.0', False)):  # fmt: skip
        (tmp_path / "machine.jsonl").write_text(row % asleep)
        assert parse_delay(f"trace:path={path}").cuttable is cuttable
        assert not parse_delay(f"trace:path={path},cut=no").cuttable
        assert parse_delay(f"trace:path={path},cut=yes").cuttable
    # a run whose injected units could not be cut says so
    (tmp_path / "machine.jsonl").write_text(row % ', "asleep": 0.98, "cut": false')
    assert not parse_delay(f"trace:path={path}").cuttable
    process = DelayProcess(f"trace:path={path},cut=no", workers=4)
    assert not process.cuttable


def test_a_bad_cut_is_refused_in_one_line(tmp_path: Path) -> None:
    path = per_iteration_trace(tmp_path, np.full(8, 0.1))
    with pytest.raises(UsageError, match="cut=yes") as refused:
        parse_delay(f"trace:path={path},cut=maybe")
    assert "\n" not in str(refused.value)
