"""The elastic layer's meeting place: the elastic agent's store (``runtime.elastic.shrink``).

The store is the launcher's (``MASTER_ADDR:MASTER_PORT`` with ``TORCHELASTIC_USE_AGENT_STORE``):
it outlives any rank, so the survivors meet there, and a dead rank's shield says so there at
once. A run's keys sit under ``tailtrain/shrink/{run id}/{restart}`` (:func:`prefix`), so a
restarted job (``--max-restarts``) starts from an empty store. The environment names a
launcher sets in a rank for the protocol live here too.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import torch.distributed as dist

from tailtrain.errors import TailtrainError

log = logging.getLogger(__name__)

#: set (to "1") in a rank started again after it died (``--restart-lost``): it joins
REJOIN = "TAILTRAIN_REJOIN"
#: set by ``tailtrain launch --restart-lost`` in a rank it started again: how many times (the
#: script skips ``dist.init_process_group``: ``integrate.StragglerStep`` joins the live ranks)
RESTART = "TAILTRAIN_RESTART"
#: set with ``REJOIN`` in the ranks of a node started again together (``tailtrain launch``
#: across nodes): the job ranks, comma-separated, that come back as one node, so the live
#: ranks take them in at one step boundary (``shrink.Shrinker.asking``)
REJOIN_WITH = "TAILTRAIN_REJOIN_WITH"
#: set with ``REJOIN`` in the ranks of a node's second start (``tailtrain launch`` across
#: nodes): the key, in this run's keys, that its launcher sets once its look at the node's
#: earlier launcher found none beating (``launching.nodes.Meeting.confirm``). The ranks import
#: meanwhile and ask to join only once it is there (``shrink.Shrinker.join``): the look costs
#: a heal nothing, and the ranks of a --node-rank given twice never ask to join
CLEARED = "TAILTRAIN_REJOIN_CLEARED"
#: set by ``tailtrain launch`` (``runtime.launching.scripts``) in every rank: its
#: ``--on-rank-loss``, which ``integrate.StragglerStep(on_rank_loss="shrink")`` needs to be
#: ``shrink``
LAUNCHED = "TAILTRAIN_ON_RANK_LOSS"


def prefix(env: Any = os.environ) -> str:
    """Where this run's keys sit in the agent's store (module docstring)."""
    run = env.get("TORCHELASTIC_RUN_ID", "local")
    return f"tailtrain/shrink/{run}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def open_store(timeout: datetime.timedelta, env: Any = os.environ) -> dist.Store:
    """A client of the agent's store, under this run's prefix."""
    host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    base = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    return dist.PrefixStore(prefix(env), base)


def note_dead(rank: int, why: str) -> None:
    """The shield of a dead rank (``runtime.expendable``) says so in the store at once, so the
    census need not wait its window for it."""
    try:
        open_store(datetime.timedelta(seconds=5)).set(f"dead/{rank}", why)
    except Exception as exc:  # the census's window still closes without it
        log.warning("could not note rank %d dead: %s", rank, exc)


def await_clearance(store: dist.Store, rank: int, timeout: float, env: Any = os.environ) -> None:
    """A rank of a node's second start (``CLEARED`` set) waits, up to ``timeout`` (--timeout),
    for its launcher's word that no earlier launcher of the node beats, before it touches the
    job's keys (``shrink.Shrinker.join``); any other rank goes on at once."""
    key = env.get(CLEARED)
    if not key:
        return
    try:
        store.wait([key], datetime.timedelta(seconds=timeout))
    except (RuntimeError, dist.DistStoreError):  # the launcher refused it, or is gone
        raise TailtrainError(
            f"rank {rank} was started again and its launcher did not clear it to join "
            f"within --timeout {timeout:g}s: the heal failed"
        ) from None
