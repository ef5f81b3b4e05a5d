"""examples/sharded_shrink_loop.py with a death the loop cannot stage: rank ``DRILL_RANK`` is
SIGKILLed at step ``DRILL_STEP``

* ``timing``: inside the round's last gather, once its group's part (the MAX within the
  group) is done and before the gather across groups: its group mate's shard index completes
  the round, its own does not (the replicate groups broke apart: no survivor may apply it);
* ``before``: as it reaches the round's commit (``runtime.elastic.commit``), before its vote
  (every collective of the round completed: the others must not apply it);
* ``after``: just after its vote (the round commits everywhere; the group leaves in the
  next)."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import torch.distributed as dist

from tailtrain.integrate.group_membership import GroupMembership
from tailtrain.integrate.mesh import ReplicaCollectives

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sharded_shrink_loop.py"


def main() -> None:
    rank, step = int(os.environ["DRILL_RANK"]), int(os.environ["DRILL_STEP"])
    when = os.environ["DRILL_WHEN"]
    vote = GroupMembership.commit

    def commit(self: GroupMembership) -> None:
        dies = self.shrinker.rank == rank and self.rounds.step == step
        if dies and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        vote(self)
        if dies:
            os.kill(os.getpid(), signal.SIGKILL)

    GroupMembership.commit = commit
    gather, calls = ReplicaCollectives.gather, [0]

    def timing(self: ReplicaCollectives, row):
        calls[0] += 1  # two gathers a round: the agreement's, then the timing's
        if when == "timing" and calls[0] == 2 * step + 2 and int(os.environ["RANK"]) == rank:
            self.within.reduce_row(row, dist.ReduceOp.MAX)  # its group's part, as its mate's
            os.kill(os.getpid(), signal.SIGKILL)
        return gather(self, row)

    ReplicaCollectives.gather = timing
    spec = importlib.util.spec_from_file_location("sharded_shrink_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.argv[0] = str(EXAMPLE)
    module.main()


if __name__ == "__main__":
    main()
