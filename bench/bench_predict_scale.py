"""Wall-clock time of `predict` (with the Local-SGD, eager and DBW rows) at 10^5 and 10^6 workers,
per delay law, every K searched.

History: 10^5 Exp(1) workers took ~80 s and 10^6 did not finish in 90 s (a quadratic membership
test, 4 N row objects). Then non-exponential laws stayed slow: K-async's Monte Carlo warmed up
for N/K iterations of O(N) work (70 s at N = 2 * 10^4, uniform), K-batch-sync sorted 100 x 3N
jobs and K-sync integrated every K at once (15 s at 10^5, and wrong for some K: one adaptive rule
shared by 10^5 narrow Beta peaks missed some). Now K-async and K-batch-sync use their mean-field
limits above 2048 workers (``tailtrain.prediction.large``), K-sync is searched on a grid and
refined, and order statistics are integrated on per-K windows.
With micro-batches (M > 1) a law without a closed-form sum used Monte Carlo of 100 x N x M
draws (20 s at 10^5 for lognormal, M = 4; refused at 10^6 for memory); now its sum's law comes
from ``theory.sums`` (split convolution, or FFT for bounded laws).
A heterogeneous pattern (per-worker speeds U(low, high), issue 25) ran a Monte Carlo of N
workers per iteration: N = 10^4 was killed after 150 s at 13.9 GB, 10^6 after 93 s of CPU.
Above 2048 workers its rows now come from the speeds' law (``prediction.context``), and
``--pattern`` runs those cases beside i.i.d. ones; each line gives the process's peak RSS so
far (it only grows), the CPU seconds beside the wall-clock ones (the machine's load moves
the latter) and the methods of sync, rebalance and rebalance:deal=demand.
Run: python bench/bench_predict_scale.py [--workers 100000 1000000] [--delay SPEC ...]
[--micro-batches 1 4 12] [--pattern iid heterogeneous:low=1,high=1.5]
"""

from __future__ import annotations

import argparse
import resource
import time

from tailtrain.delays import parse_delay, parse_pattern
from tailtrain.prediction import DelayScenario, predict
from tailtrain.prediction.families import with_families

LAWS = (
    "exp:rate=1",
    "uniform:low=0.5,high=1.5",
    "shifted-exp:shift=1,rate=1",
    "lognormal:mu=0,sigma=0.5",
    "pareto:shape=2,scale=1",
    "gamma:shape=2,rate=1",
    "const:value=0.5+dropcompute-noise:scale=0.5",
)
PATTERNS = ("iid", "heterogeneous:low=1,high=1.5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[10**5, 10**6])
    parser.add_argument("--delay", nargs="+", default=list(LAWS))
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 4, 12])
    parser.add_argument("--pattern", nargs="+", default=list(PATTERNS))
    args = parser.parse_args()
    cases = [
        (workers, pattern, m, spec)
        for workers in args.workers
        for pattern in args.pattern
        for m in args.micro_batches
        for spec in args.delay
    ]
    for workers, pattern, m, spec in cases:
        scenario = DelayScenario(
            workers,
            parse_delay(spec),
            pattern=None if pattern == "iid" else parse_pattern(pattern),
            micro_batches=m if m > 1 else None,
        )
        start, cpu = time.perf_counter(), time.process_time()
        prediction = with_families(predict(scenario))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        best = {r.strategy: r.k for r in prediction.rows if r.best}
        method = {r.spec or r.strategy: r.method for r in prediction.rows}
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"N={workers:>8} M={m:>2} {pattern:28s} {spec:44s} {seconds:6.2f} s "
            f"({cpu:5.2f} s CPU), "
            f"peak {rss:5.0f} MB, {len(prediction.rows)} rows, best K: k-sync "
            f"{best['k-sync']}, k-async {best['k-async']}; sync: {method['sync']}, "
            f"rebalance: {method['rebalance']}, "
            f"rebalance:deal=demand: {method.get('rebalance:deal=demand')}",
            flush=True,
        )


if __name__ == "__main__":
    main()
