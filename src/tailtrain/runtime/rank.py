"""The contract of a runtime topology, and the one driver of a rank's run.

A rank of any topology (``runtime.allreduce``, ``runtime.partial``, ``runtime.ps``: its server
and its workers) is a :class:`RankRun`, a contract the size of PyTorch's ``Joinable``
(``torch.distributed.algorithms.join``: a join hook, a device, a process group), three
methods that :func:`drive_rank` calls:

* ``updates()``: the per-round operation, a generator that yields the index of each update
  as this rank starts its work for it (an allreduce or partial-collective round, the server's
  step, the version of a worker's job), does that work when resumed, and returns when the run
  is over (its budget spent, or Ctrl-C asked to stop);
* ``failed(exc)``: the join hook, this rank's part when the group fails (a peer died or hung,
  the launcher stopped it, a drill raised): census, checkpoint, note; returns the exception
  the rank ends with;
* ``finish()``: the shutdown after the last update: final scores, summary, the run folder.

The fault drills (``--inject-fault``, ``runtime.inject.FaultDrill``) sit at the boundary every
rank entry gets, its :class:`~tailtrain.runtime.reduce.Collectives` (``Collectives.drill``,
armed once per run by the launcher from the topology's spec), and :func:`drive_rank` meets them at
every update a rank yields, raised inside the generator where it yielded: a topology cannot
forget a drill, as the eager topology once forgot ``--fail-at``. The numeric drills poison a
gradient where the topology computed it (``FaultDrill.poison``), before its screen.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Protocol, runtime_checkable

from tailtrain.runtime.config import RankResult
from tailtrain.runtime.inject import FaultDrill

#: what ``RankRun.updates`` returns: the updates this rank starts, one by one
Updates = Generator[int, None, None]


@runtime_checkable
class RankRun(Protocol):
    """One rank's run in a runtime topology (module docstring)."""

    def updates(self) -> Updates:
        """The per-round operation: yield each update's index as its work starts."""
        ...

    def failed(self, exc: BaseException) -> BaseException:
        """The group failed with ``exc``: this rank's part; the exception to end with."""
        ...

    def finish(self) -> RankResult:
        """After the last update: this rank's result."""
        ...


def drive_rank(run: RankRun, drill: FaultDrill) -> RankResult:
    """Run ``run`` to its end, meeting ``drill`` at each update (module docstring)."""
    try:
        meet_drills(run.updates(), drill)
    except BaseException as exc:
        end = run.failed(exc)
        if end is exc:
            raise
        raise end from exc
    return run.finish()


def meet_drills(updates: Updates, drill: FaultDrill) -> None:
    """Play ``updates`` to their end; the drills due at an update fire as it is yielded, and
    a raise is thrown into the generator there, as if its loop had raised it itself."""
    update = next(updates, None)
    while update is not None:
        try:
            drill.before(update)
        except BaseException as exc:
            try:
                update = updates.throw(exc)
            except StopIteration:
                return
            continue
        update = next(updates, None)
