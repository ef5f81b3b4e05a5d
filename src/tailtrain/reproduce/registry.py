"""The reproductions: one entry per paper figure or table, ``tailtrain reproduce --list``.

Each entry names its paper and figure, says what it runs, and has ``run(out, quick) ->
Report``. Its sizes (``--quick`` and full) are printed by ``--list``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tailtrain.core.records import prepare_folder
from tailtrain.errors import UsageError
from tailtrain.reproduce import dbw, dropcompute, eager, lgc, stale
from tailtrain.reproduce.report import Report
from tailtrain.reproduce.runs import Sizes, on_task


@dataclass(frozen=True)
class Experiment:
    name: str
    paper: str
    figure: str
    description: str
    sizes: Sizes
    run: Callable[[Path, bool], Report]

    def __call__(self, out: Path, quick: bool, task: str | None = None) -> Report:
        """Run into ``out`` (created), write ``report.md`` and stamp the wall-clock time;
        ``task`` in place of the experiment's own (``check_task`` first)."""
        out = prepare_folder(out)
        start = time.perf_counter()
        with on_task(task):
            report = self.run(out, quick)
        report.seconds = time.perf_counter() - start
        report.task = task
        report.write(out)
        return report

    def check_task(self, task: str) -> None:
        """Refuse ``--task`` where the experiment trains no model (it times workers only)."""
        if not self.sizes.takes_task:
            raise UsageError(
                f"reproduce {self.name} trains no model (it times workers only), so --task "
                "does not apply to it; drop --task"
            )


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment(
        "dropcompute-fig1", "DropCompute", "Fig. 1",
        "scale graph: sync and DropCompute throughput against N (8 to 2048), simulated "
        "(task none) and by Eqs. 7/11",
        dropcompute.FIG1, dropcompute.fig1,
    ),
    Experiment(
        "dropcompute-fig3", "DropCompute", "Fig. 3",
        "S_eff against tau (simulation, analytical, analytical given E[T]) with tau* marked, "
        "normal and noisy micro-batches, plus a simulated run at tau*",
        dropcompute.FIG3, dropcompute.fig3,
    ),
    Experiment(
        "dropcompute-c3", "DropCompute", "App. C.3",
        "E[T]/E[T_i] for each noise type of Figs. 13-14, exact and simulated, with "
        "DropCompute's gain",
        dropcompute.C3, dropcompute.noise_c3,
    ),
    Experiment(
        "dropcompute-table1", "DropCompute", "Table 1",
        "test accuracy against drop rate, and at 10% with extra steps, larger batch, resample",
        dropcompute.TABLE1, dropcompute.table1,
    ),
    Experiment(
        "dbw-fig6", "DBW", "Fig. 6",
        "time to a train loss for DBW, B-DBW and static k under 1-a+a Exp(1), a in {0, 0.2, 1}",
        dbw.FIG6, dbw.fig6,
    ),
    Experiment(
        "dbw-fig8", "DBW", "Fig. 8",
        "time to a train loss against the batch size B for DBW, B-DBW and static k",
        dbw.FIG8, dbw.fig8,
    ),
    Experiment(
        "dbw-fig9", "DBW", "Fig. 9",
        "half the workers slow down 5x mid-run (slowdown pattern); k_t of DBW tracks it",
        dbw.FIG9, dbw.fig9,
    ),
    Experiment(
        "dbw-fig10", "DBW", "Fig. 10",
        "DBW against AdaSync: k_t at a = 0.1 and time to a train loss against a",
        dbw.FIG10, dbw.fig10,
    ),
    Experiment(
        "eager-fig9", "eager-SGD", "Fig. 9",
        "collective microbenchmark: latency and NAP of allreduce, solo, majority, quorum "
        "on linearly skewed processes",
        eager.FIG9, eager.fig9,
    ),
    Experiment(
        "eager-fig10", "eager-SGD", "Fig. 10",
        "hyperplane regression, 8 processes, one random process delayed 200/300/400 ms: "
        "throughput and validation MSE of sync, solo and majority",
        eager.FIG10, eager.fig10,
    ),
    Experiment(
        "eager-fig12", "eager-SGD", "Fig. 12",
        "solo against majority under severe rotating skew (50-400 ms): accuracy against time",
        eager.FIG12, eager.fig12,
    ),
    Experiment(
        "stale-fig6", "slow-and-stale", "Fig. 6",
        "async speedup E[T_sync]/E[T_async] against P for Exp(1), 1+Exp(1), Pareto(2,1): "
        "Theorem 1 and simulated",
        stale.FIG6, stale.fig6,
    ),
    Experiment(
        "stale-fig7", "slow-and-stale", "Fig. 7",
        "runtime of 2000 iterations against K for K-sync, K-async, K-batch-async (predict "
        "and simulated), Pareto(2,1) and 1+Exp(1)",
        stale.FIG7, stale.fig7,
    ),
    Experiment(
        "stale-fig9-10", "slow-and-stale", "Figs. 9-10",
        "test error against time for each K, K-sync and K-async, without and with an "
        "exponential delay",
        stale.FIG9, stale.fig9_10,
    ),
    Experiment(
        "stale-fig11", "slow-and-stale", "Fig. 11",
        "AdaSync (K-sync and K-async bases) against fixed K under an exponential delay",
        stale.FIG11, stale.fig11,
    ),
    Experiment(
        "lgc-fig3", "LGC", "Fig. 3",
        "test accuracy of Full-SGD, K-SGD and LGC against non-IID level and straggling "
        "period h",
        lgc.FIG3, lgc.fig3,
    ),
    Experiment(
        "lgc-fig5", "LGC", "Fig. 5",
        "the K trade-off: training time, train loss and test accuracy for K = 5..10",
        lgc.FIG5, lgc.fig5,
    ),
    Experiment(
        "lgc-fig6", "LGC", "Fig. 6",
        "partial work of stragglers (s = 4 blocks) with and without linear scaling (Eq. 6)",
        lgc.FIG6, lgc.fig6,
    ),
)  # fmt: skip

BY_NAME = {e.name: e for e in EXPERIMENTS}


def find(name: str) -> list[Experiment]:
    """The experiment called ``name``, or all of them for ``all``."""
    if name == "all":
        return list(EXPERIMENTS)
    if name not in BY_NAME:
        raise UsageError(
            f"unknown experiment {name!r}; run 'tailtrain reproduce --list' for the names, "
            "or give 'all'"
        )
    return [BY_NAME[name]]
