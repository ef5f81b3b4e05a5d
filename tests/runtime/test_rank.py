"""The runtime topology's contract and its one driver (``runtime.rank``): the drills are met
at every update a rank yields, a raise lands inside the rank's loop, and a failure goes
through the rank's own ``failed``. Without processes: a rank here is a plain object."""

from __future__ import annotations

import pytest

from tailtrain.faults import FaultPlan
from tailtrain.runtime.config import RankResult
from tailtrain.runtime.inject import FaultDrill, InjectedFault
from tailtrain.runtime.rank import RankRun, Updates, drive_rank
from tailtrain.runtime.reduce import Collectives


class Rank:
    """Three updates; notes where the loop saw what (a :class:`RankRun`)."""

    def __init__(self, first: int = 0, skip: int = 0) -> None:
        self.first, self.skip, self.seen, self.ended = first, skip, [], None

    def updates(self) -> Updates:
        step = self.first
        while step < self.first + 3:
            try:
                yield step
            except InjectedFault:
                self.seen.append(("raised in the loop", step))
                raise
            self.seen.append(("work", step))
            step += 1 + self.skip

    def failed(self, exc: BaseException) -> BaseException:
        self.ended = exc
        return RuntimeError(f"kept: {exc}")

    def finish(self) -> RankResult:
        return RankResult(0, None, None)  # type: ignore[arg-type]


def drill(text: str | None, rank: int = 1) -> FaultDrill:
    return FaultDrill(FaultPlan.parse([text] if text else [], 2), rank)


def test_a_run_without_drills_does_every_update_and_finishes():
    rank = Rank()
    assert isinstance(rank, RankRun)  # the contract's three methods
    assert drive_rank(rank, drill(None)).rank == 0
    assert rank.seen == [("work", 0), ("work", 1), ("work", 2)] and rank.ended is None


def test_a_raise_drill_lands_in_the_loop_at_its_update_and_ends_through_failed():
    rank = Rank()
    with pytest.raises(RuntimeError, match="kept: rank 1 fails at step 1") as err:
        drive_rank(rank, drill("raise:rank=1,step=1"))
    assert rank.seen == [("work", 0), ("raised in the loop", 1)]
    assert isinstance(rank.ended, InjectedFault) and err.value.__cause__ is rank.ended


def test_a_rank_that_skips_an_update_meets_its_drill_at_the_next_it_starts():
    rank = Rank(skip=1)  # updates 0, 2: the drill of update 1 hits at 2
    with pytest.raises(RuntimeError, match="fails at step 2"):
        drive_rank(rank, drill("raise:rank=1,step=1"))
    assert rank.seen == [("work", 0), ("raised in the loop", 2)]


def test_the_collectives_carry_the_runs_drill_once_armed():
    import torch

    comm = Collectives(1, 2, torch.device("cpu"))
    assert not comm.drill.plan.faults  # none until the launcher arms it
    armed = drill("raise:rank=1,step=0")
    comm.arm(armed)
    assert comm.drill is armed


def test_every_topologys_rank_is_a_rank_run():
    from tailtrain.runtime.allreduce.rounds import _Rank
    from tailtrain.runtime.partial.rounds import _Run
    from tailtrain.runtime.ps.server import Server
    from tailtrain.runtime.ps.worker import Worker

    for rank in (_Rank, _Run, Server, Worker):
        assert all(callable(getattr(rank, m, None)) for m in ("updates", "failed", "finish"))
