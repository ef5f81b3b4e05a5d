"""examples/sharded_shrink_loop.py with a death the loop cannot stage: rank ``DRILL_RANK`` is
SIGKILLed at step ``DRILL_STEP`` as it reaches the round's commit (``runtime.elastic.commit``),
``before`` its vote (every replicate all-reduce of the round completed: the others must not
apply it) or ``after`` it (the round commits everywhere; the group leaves in the next)."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

from tailtrain.integrate.group_membership import GroupMembership

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
    spec = importlib.util.spec_from_file_location("sharded_shrink_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.argv[0] = str(EXAMPLE)
    module.main()


if __name__ == "__main__":
    main()
