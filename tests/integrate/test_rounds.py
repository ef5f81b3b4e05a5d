"""``Rounds`` on one rank with the other's rows given: what the rule sees from a round.

A fake group hands back prepared gathers, so these run without processes and compare the
loop's round with ``train``'s (``runtime.allreduce``) on the same gathered rows.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.integrate.rounds import RoundProgress, Rounds
from tailtrain.runtime.allreduce.accounts import settle
from tailtrain.runtime.allreduce.state import Clock, Membership
from tailtrain.runtime.control import round_times, screened_out
from tailtrain.runtime.telemetry import TraceRows

UNITS = 2


class Gathers:
    """Rank 0 of two: each ``gather`` returns the next prepared (N, width) rows, its own row
    included (the measured seconds are the test's, not this process's)."""

    rank, world_size, device = 0, 2, torch.device("cpu")

    def __init__(self, *rows) -> None:
        self.rows = [np.asarray(r, dtype=np.float64) for r in rows]

    def gather(self, row) -> np.ndarray:
        gathered = self.rows.pop(0)
        assert gathered.shape[1] == np.asarray(row).size  # laid out as this rank's row
        return gathered


def loop_round(strategy: str, timing: np.ndarray, screened: bool = False):
    """One round of the loop on rank 0, its gathered ``timing`` rows [reduce seconds, round
    seconds, screened] given (no rank asks to join: the gather's last column, asks, is 0); the
    StepStats the rule adapted on and the record."""
    work = RoundProgress(np.full(UNITS, 0.1), compute=0.2, loss_sum=1.0)
    counts = [[UNITS, 0.2, 1.0, 0.1, 0.1], [UNITS, 0.3, 1.0, 0.15, 0.15]]
    rounds = Rounds(strategy, Gathers(counts, np.c_[timing, np.zeros(len(timing))]))
    seen = []
    adapt = rounds.rule.adapt
    rounds.rule.adapt = lambda stats: (seen.append(stats), adapt(stats))[1]
    plan, _ = rounds.plan(UNITS)
    agreed = rounds.agree(work)
    record = rounds.close(plan, work, agreed, float(timing[0, 0]), screened)
    return seen[0], record


def train_settles(timing: np.ndarray) -> SimpleNamespace:
    done = SimpleNamespace(ex=SimpleNamespace(step=0))
    run = SimpleNamespace(unsettled=done, clock=Clock(), membership=Membership(), settling=[])
    run.trace = TraceRows(0, per_micro_batch=False, charged=True)
    settle(run, timing)
    return run


seconds = st.floats(0.001, 10.0, allow_nan=False)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(seconds, seconds), min_size=2, max_size=2))
def test_train_and_the_loop_feed_algorithm_2_the_same_t_c(rows):
    """T^c is the smallest allreduce seconds over the ranks (the last to arrive waits
    least: DropCompute's T = T^c + max_n T_n), in ``train`` and in ``StragglerStep`` alike."""
    timing = np.array(rows)
    stats, record = loop_round("dropcompute:calibrate=3", np.c_[timing, [0, 0]])
    run = train_settles(timing)
    assert stats.comm_time == record.comm_time == run.clock.comm_time == min(timing[:, 0])
    assert record.time == run.clock.settled == max(timing[:, 1])
    assert round_times(timing) == (run.clock.comm_time, run.clock.settled)
    assert run.trace.walls == {0: run.clock.settled}  # the trace charges the round's wall seconds


@pytest.mark.timeout(30)
def test_a_rank_that_waited_inside_the_allreduce_does_not_inflate_t_c():
    # rank 0 arrived first and waited 0.25 s for rank 1 inside the allreduce
    timing = np.array([[0.30, 1.0, 0], [0.05, 1.2, 0]])
    stats, record = loop_round("dropcompute:calibrate=3", timing)
    assert stats.comm_time == record.comm_time == 0.05


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("strategy", "weight"),
    [("sync", 1.0), ("dropcompute:threshold=5", 0.5)],  # DropCompute divides by N (Eq. (1))
)
def test_a_screened_rank_is_not_used_in_the_rules_stats_nor_the_record(strategy, weight):
    """Rank 1's gradient held a NaN: it joined with weight 0, so the rule does not count it
    as used (as ``train`` and ``simulate`` do not), and the record gives it no weight."""
    stats, record = loop_round(strategy, np.array([[0.1, 1.0, 0], [0.1, 1.0, 1]]))
    arrivals = stats.arrivals
    assert stats.used.tolist() == arrivals.keys[arrivals.worker == 0].tolist()
    assert record.ranks == [0] and record.weights == [weight, 0.0] and record.nonfinite == 1
    screened = np.array([False, True])
    assert (screened_out(arrivals.keys, arrivals, screened) == stats.used).all()
    clean, _ = loop_round(strategy, np.array([[0.1, 1.0, 0], [0.1, 1.0, 0]]))
    assert clean.used.tolist() == clean.arrivals.keys.tolist()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("strategy", ["sync", "dropcompute:threshold=5"])
def test_a_round_whose_every_gradient_was_screened_out_is_empty(strategy):
    """Both ranks counted micro-batches but both were screened out (NaN): no gradient entered,
    so ``StragglerStep`` skips the optimizer (its reduced sum of weights is 0), and the record
    says ``empty``, which a DDP-hook loop reads to skip ``optimizer.step()`` the same way; one
    screened rank of two leaves the round a real update."""
    _, both = loop_round(strategy, np.array([[0.1, 1.0, 1], [0.1, 1.0, 1]]))
    assert both.ranks == [] and both.completed == [UNITS, UNITS] and both.empty
    _, one = loop_round(strategy, np.array([[0.1, 1.0, 0], [0.1, 1.0, 1]]))
    assert one.ranks == [0] and not one.empty
