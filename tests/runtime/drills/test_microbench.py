"""eager-SGD's collective microbenchmark on real processes (``runtime.drills.microbench``;
``tailtrain bench collectives``): what it reports and the network it fits."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.network import parse_network
from tailtrain.runtime.drills.microbench import (
    RealBench,
    activation_latency,
    run_real_microbenchmark,
)
from tailtrain.runtime.partial.collective import DIRECT_ACTIVATION

pytestmark = pytest.mark.timeout(90)


def test_the_benchmark_reports_every_collective_and_a_network_simulate_accepts():
    """A short real run of `bench collectives`: NAP follows each collective's definition
    (the allreduce counts everyone, solo its first caller at least; majority and quorum lie
    between), and the network spec it writes parses back to the same figures."""
    bench = RealBench(procs=3, iterations=3, skew="linear:step=0.05")
    results = run_real_microbenchmark(bench)
    naps = {name: s.nap for name, s in results.stats.items()}
    assert naps["allreduce"] == 3
    assert 1 <= naps["solo"] <= naps["quorum"] <= 3 and 1 <= naps["majority"] <= 3
    assert naps["quorum"] >= bench.quorum_size
    assert parse_network(results.network.spec()) == results.network
    assert results.network.hop >= 0 and results.network.allreduce > 0
    assert results.network.direct == DIRECT_ACTIVATION and results.network.send >= 0


def test_the_benchmark_fits_hop_and_send_from_direct_activation_times():
    """Rows as ``round_summary`` writes them, from known figures: the initiator writes to
    every other rank in ascending order, its m-th message arrives m sends and a hop later;
    rounds with two initiators (a solo race) are left out of the fit."""
    procs, hop, send = 6, 2e-3, 3e-4
    rows = []
    for r, source in enumerate([0, 3, 5, 2]):
        start = 0.1 * r
        place = [len([p for p in range(procs) if p != source and p <= q]) for q in range(procs)]
        act = [start if q == source else start + hop + place[q] * send for q in range(procs)]
        flags = [float(q == source) for q in range(procs)]
        rows.append([r, 1, min(act), max(act), 0.0, *flags, *act])
    rows.append([9, 2, 0.0, 0.5, 0.0, *([1.0, 1.0] + [0.0] * 4), *([0.0, 0.0] + [0.5] * 4)])
    assert activation_latency(np.array(rows), procs) == pytest.approx((hop, send))
