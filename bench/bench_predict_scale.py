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
Run: python bench/bench_predict_scale.py [--workers 100000 1000000] [--delay SPEC ...]
[--micro-batches 1 4 12]
"""

from __future__ import annotations

import argparse
import time

from tailtrain.delays import parse_delay
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[10**5, 10**6])
    parser.add_argument("--delay", nargs="+", default=list(LAWS))
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 4, 12])
    args = parser.parse_args()
    for workers in args.workers:
        for m in args.micro_batches:
            for spec in args.delay:
                scenario = DelayScenario(
                    workers, parse_delay(spec), micro_batches=m if m > 1 else None
                )
                start = time.perf_counter()
                prediction = with_families(predict(scenario))
                seconds = time.perf_counter() - start
                best = {r.strategy: r.k for r in prediction.rows if r.best}
                print(
                    f"N={workers:>8} M={m:>2} {spec:44s} {seconds:6.2f} s, "
                    f"{len(prediction.rows)} rows, best K: k-sync {best['k-sync']}, "
                    f"k-async {best['k-async']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
