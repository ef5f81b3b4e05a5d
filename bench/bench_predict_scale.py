"""Wall-clock time of `predict` at 10^5 and 10^6 workers (Exp(1) delays, every K searched).

Before the fix, 10^5 took ~80 s and 10^6 did not finish in 90 s: a quadratic membership test
(`r.k in ctx.ks`, a list of N K values) and 4 N row objects.
Run: python bench/bench_predict_scale.py
"""

from __future__ import annotations

import time

from tailtrain.delays import parse_delay
from tailtrain.predict import Scenario, predict


def main() -> None:
    for workers in (10**5, 10**6):
        start = time.perf_counter()
        prediction = predict(Scenario(workers=workers, delay=parse_delay("exp:rate=1")))
        seconds = time.perf_counter() - start
        best = next(r.k for r in prediction.rows if r.strategy == "k-sync" and r.best)
        print(
            f"predict N={workers:>8}: {seconds:6.2f} s, {len(prediction.rows)} rows, best K={best}"
        )


if __name__ == "__main__":
    main()
