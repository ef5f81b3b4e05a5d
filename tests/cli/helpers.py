"""What the CLI tests share: running ``tailtrain`` as a user does."""

from __future__ import annotations

import numpy as np

from tailtrain.cli import main


def run(argv: list[str], capture) -> tuple[int, str, str]:
    """``tailtrain ARGV`` in this process: (exit status, stdout, stderr), a ``SystemExit``
    (argparse's exit 2) included; ``capture`` is pytest's ``capsys`` or ``capfd`` (the latter
    when launched ranks write to the same terminal)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capture.readouterr()
    return code, out, err


def trained_time_parts(strategy: str, out, capture, ranks: list[int], first_worker: int = 0):
    """``train`` (logreg, 3 workers, injected sleeps) with ``strategy`` into ``out``, checked
    as issue 23 asks of every topology: each rank's step (rank-steps.jsonl) in five parts >= 0
    that sum to its wall seconds, the summary's means of them summing to the mean step, and
    each job's trace ``noncompute`` equal to its step less its seconds (the trace numbers
    workers from 0; ``first_worker`` is worker 0's rank). Returns the injected seconds."""
    import json

    import numpy as np
    import pandas as pd
    import pytest

    from tailtrain.delays.trace import read_trace

    argv = ["train", "--task", "logreg", "--workers", "3", "--strategy", strategy]
    argv += ["--delay", "const:value=0.03", "--pattern", "rotating:low=0,high=0.06"]
    argv += ["--iterations", "12", "--eval-every", "100", "--out", str(out), "--json"]
    code, printed, err = run(argv, capture)
    assert code == 0, err
    summary = json.loads(printed)
    steps = pd.read_json(out / "rank-steps.jsonl", lines=True)
    assert sorted(steps["rank"].unique()) == ranks
    columns = ("rank_compute", "rank_injected", "rank_wait", "rank_comm", "rank_overhead")
    compute, injected, wait, comm, overhead = (np.concatenate(steps[c].tolist()) for c in columns)
    for part in (compute - injected, injected, wait, comm, overhead):
        assert (part >= 0).all()
    np.testing.assert_allclose(compute + wait + comm + overhead, steps["step_time"])
    means = [summary[f"mean_{p}_time"] for p in ("compute", "injected", "wait", "comm", "overhead")]
    assert sum(means) == pytest.approx(steps["step_time"].mean())
    trace = read_trace(out / "trace.csv")
    by_job = steps.set_index(["rank", "job"])
    keys = list(zip(trace.worker + first_worker, trace.iteration, strict=True))
    expected = by_job.loc[keys, "step_time"].to_numpy() - trace.seconds
    np.testing.assert_allclose(trace.noncompute, expected)
    return injected, means


def spiky_micro_batch_trace(seed: int = 0) -> str:
    """A trace's text: 80 iterations of 4 workers x 4 micro-batches, each 10 ms plus an
    exponential 10 ms, five times that in one micro-batch of ten (a tail DropCompute cuts)."""
    rng = np.random.default_rng(seed)
    rows = [
        f"{i},{w},{m},{0.01 + rng.exponential(0.01) * (5 if rng.random() < 0.1 else 1):.9f}"
        for i in range(80)
        for w in range(4)
        for m in range(4)
    ]
    return "iteration,worker,micro_batch,seconds\n" + "\n".join(rows) + "\n"
