"""A rank entry for the shrink tests of both topologies (allreduce, partial collective): rank 2
checks in to the first census, then dies (SIGKILL) before the group forms."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from typing import Any

from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.elastic.shrink import Shrinker
from tailtrain.runtime.reduce import Collectives


def dies_in_census(train: Callable[[TrainConfig, Collectives], Any], cfg, comm) -> Any:
    """Run ``train`` (a topology's rank entry); rank 2 dies inside its first census. Call it
    from a module-level entry of the test module, not a ``functools.partial``: only a plain
    function starts in the launcher's fork server
    (``runtime.launching.launch.reaches_fork_server``); anything else forks from the test
    process, where a rank sometimes never joins the group."""
    if comm.rank == 2:

        def census(self, step, rows):
            self.store.set(f"gen{self.generation}/in/{self.rank}", json.dumps([step, rows]))
            os.kill(os.getpid(), signal.SIGKILL)

        Shrinker.census = census
    return train(cfg, comm)
