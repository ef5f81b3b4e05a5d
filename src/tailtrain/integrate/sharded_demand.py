"""A sharded step dealt on demand (``rebalance:deal=demand`` under ``integrate.sharded``):
what it checks before any collective (the job's rendezvous store, the stream it is given) and
the opening of each group's dealer, which every rank learns the outcome of."""

from __future__ import annotations

import datetime
import itertools
import os
from typing import Any

import torch.distributed as dist

from tailtrain.errors import TailtrainError, UsageError
from tailtrain.runtime.dealer import Dealer
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import Strategy

#: every rank numbers its steps dealt on demand alike (it makes them in the same order):
#: each one's store keys apart from the others' in the job
_DEALERS = itertools.count()


def check_store(rule: Strategy, env: Any = os.environ) -> bool:
    """Whether ``rule`` deals on demand, which needs the job's rendezvous store (env://);
    one line where the environment does not name it, before any collective."""
    if "demand" not in rule.needs:
        return False
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        raise UsageError(
            f"{rule.describe()!r} deals micro-batches from the job's rendezvous store: "
            f"set {' and '.join(missing)} (env://, as torchrun does)"
        )
    return True


def open_dealer(
    within: Collectives, across: Collectives, timeout: datetime.timedelta | None
) -> Dealer | None:
    """The group's first rank's dealer (module docstring), with its own keys in the store;
    every rank learns whether every dealer opened (one small all_reduce within the group and
    one across), so that no rank is left waiting for one that failed."""
    keys = f"/sharded/{next(_DEALERS)}"  # every rank numbers its steps alike
    dealer, failed = None, ""
    if within.rank == 0:
        try:
            waits = timeout or dist.default_pg_timeout
            dealer = Dealer.open(waits, tidy=across.rank == 0, prefix=keys)
        except Exception as exc:  # the store cannot be reached: said on every rank below
            failed = f"{type(exc).__name__}: {exc}".splitlines()[0]
    group_failed = within.reduce_row([bool(failed)], dist.ReduceOp.MAX)
    if across.reduce_row(group_failed, dist.ReduceOp.MAX)[0] > 0:
        if dealer is not None:
            dealer.close()
        why = failed or "another group's first rank could not"
        raise TailtrainError(f"ShardedStep: the deal on demand could not open its store ({why})")
    return dealer


def check_stream(stream: Any, needs: int, broken: bool) -> None:
    """One line, before any wait, for a call dealt on demand that cannot go on: a step whose
    last round failed (its counters are spent), or a stream that is not indexed by position
    or is shorter than the round may deal (``needs`` positions)."""
    if broken:
        raise UsageError(
            "ShardedStep: a round dealt on demand failed, and its counters are spent: build a "
            "new step (from a checkpoint) to go on"
        )
    if not hasattr(stream, "__getitem__"):
        raise UsageError(
            "ShardedStep dealt on demand takes this rank's stream of micro-batches, indexed by "
            f"position (stream[i]: a list, a map-style dataset), got {type(stream).__name__}"
        )
    length = getattr(stream, "__len__", None)
    if length is not None and length() < needs:
        raise UsageError(
            f"ShardedStep dealt on demand may deal up to position {needs - 1} this round; the "
            f"stream holds {length()} micro-batches"
        )
