"""A step dealt on demand in a user's loop (``rebalance:deal=demand``): ``StragglerStep`` (each
rank its own worker) and ``ShardedStep`` (each replica group, its first rank dealing for it)
deal a step's pool of N M micro-batches of the loop's STREAM, indexed by position, from the
job's rendezvous store (``runtime.dealer``): the k-th ask of a round takes position
``taken + k``, where ``taken`` (``Rounds.stream``) counts the positions the completed rounds
dealt. This module holds what both steps do alike: the checks before any collective (the
store, the stream), the opening of the dealers, and one round's deal (:class:`StreamDeal`).

**One round.** The worker's dealing rank asks for a unit (the store's ask counter), and every
rank of the worker learns which from one all_reduce(MAX) over the worker's group (none for a
worker of one rank); after the unit it asks for the next the same way: one store round trip
a unit. A unit in flight is the model's own forward and backward, which cannot be cut, so the
round deals the pool's N M units alone (``strategies.rebalance.deals``) and every one counts:
no completion is reported, and the first ask past the pool sets the round's stop
(``DealtRound.ask_within``). A worker whose asks ran out goes to the round's gather, where it
waits for the others' last units (its wait, for a probe). Only past the round's collectives
does it ``leave`` the round (its waiter saw the stop key, set before any rank could reach the
gather's end), so a worker never waits on the store for a peer that died: it meets the death
in a watched collective. The store's keys of a round go two rounds later (``Dealer``'s tidy):
every rank left it by then.

**Losing a rank** (``StragglerStep(on_rank_loss="shrink")``). A round's keys are its
generation's and step's. A rank whose round broke sets the stop of that round and of the next
in its generation (``Dealer.broke``) before the census, so no waiter waits on them and a
member one round ahead stops dealing. The stream's place moves only when a round completes,
and travels in ``Rounds``' state with the round count, so after the regroup every survivor
holds the lead's: a round the lead completed is taken from it; one nobody completed is dealt
again under the new generation's keys from the same positions, and the survivors compute the
whole pool among themselves (``strategies.rebalance``'s follow_world keeps N M): the global
batch is kept, and only the broken round's units are computed twice. A rank started again
opens its dealer and takes the place from the lead as it joins. The lowest live rank tidies.
"""

from __future__ import annotations

import datetime
import itertools
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from tailtrain.errors import TailtrainError, UsageError
from tailtrain.integrate.probe import batch_samples, watching
from tailtrain.runtime.dealer import Dealer, DealtRound
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import AllreducePlan, Strategy
from tailtrain.strategies.rebalance import deals

if TYPE_CHECKING:
    import torch

    from tailtrain.integrate.rounds import Agreement, RoundProgress, Rounds


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
    within: Collectives | None,
    across: Collectives,
    timeout: datetime.timedelta | None,
    owner: str = "ShardedStep",
    alone: bool = False,
) -> Dealer | None:
    """The worker's dealing rank's dealer (module docstring), with its own keys in the store:
    the group's first rank (``within``; None: every rank is a worker of its own); every rank
    learns whether every dealer opened (one small all_reduce within the group and one across),
    so that no rank is left waiting for one that failed. ``alone``: a rank started again, in
    no group yet, opens its own (it tidies nothing) and fails alone."""
    keys = f"/{owner}/{next(_DEALERS)}"  # every rank numbers its steps alike
    dealer, failed = None, ""
    waits = timeout or dist.default_pg_timeout
    if alone:
        return Dealer.open(waits, tidy=False, prefix=keys)
    if within is None or within.rank == 0:
        try:
            dealer = Dealer.open(waits, tidy=across.rank == 0, prefix=keys)
        except Exception as exc:  # the store cannot be reached: said on every rank below
            failed = f"{type(exc).__name__}: {exc}".splitlines()[0]
    group_failed = [bool(failed)]
    if within is not None:
        group_failed = within.reduce_row(group_failed, dist.ReduceOp.MAX)
    if across.reduce_row(group_failed, dist.ReduceOp.MAX)[0] > 0:
        if dealer is not None:
            dealer.close()
        why = failed or "another worker's dealing rank could not"
        raise TailtrainError(f"{owner}: the deal on demand could not open its store ({why})")
    return dealer


def check_stream(stream: Any, needs: int, broken: bool, owner: str = "ShardedStep") -> None:
    """One line, before any wait, for a call dealt on demand that cannot go on: a step whose
    last round failed (its counters are spent), or a stream that is not indexed by position
    or is shorter than the round may deal (``needs`` positions)."""
    if broken:
        raise UsageError(
            f"{owner}: a round dealt on demand failed, and its counters are spent: build a "
            "new step (from a checkpoint) to go on"
        )
    if not hasattr(stream, "__getitem__"):
        raise UsageError(
            f"{owner} dealt on demand takes this rank's stream of micro-batches, indexed by "
            f"position (stream[i]: a list, a map-style dataset), got {type(stream).__name__}"
        )
    length = getattr(stream, "__len__", None)
    if length is not None and length() < needs:
        raise UsageError(
            f"{owner} dealt on demand may deal up to position {needs - 1} this round; the "
            f"stream holds {length()} micro-batches"
        )


class StreamDeal:
    """One step's side of the deal on demand (module docstring): ``rounds`` (whose ``stream``
    is the place), the worker's ``dealer`` (None on a rank of a group that does not deal),
    ``within`` the worker's group (None: a worker of one rank) and ``owner`` the step a probe
    watches (its waits are the rank's)."""

    def __init__(
        self,
        rounds: Rounds,
        dealer: Dealer | None,
        within: Collectives | None,
        owner: Any,
        name: str,
    ) -> None:
        self.rounds, self.dealer, self.within, self.owner, self.name = (
            rounds, dealer, within, owner, name,
        )  # fmt: skip
        #: a round failed outside the elastic layer: its counters are spent
        self.broken = False
        #: the round being dealt, until its ``leave`` (or ``fail``)
        self.current: DealtRound | None = None
        #: ``close`` ran: no round may be dealt
        self.closed = False

    def compute(
        self,
        stream: Sequence[Any],
        loss_fn: Callable[[Any], torch.Tensor],
        plan: AllreducePlan,
        work: RoundProgress,
        generation: int = 0,
        backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    ) -> tuple[int | None, list[int]]:
        """The round's units dealt to this worker (module docstring), measured into ``work``;
        the samples this rank computed (None: a batch without a size) and the k of every unit
        the worker was dealt, in order. The caller ``leave``s after the round's collectives.
        ``backward(loss)`` runs each unit's backward (``StragglerStep``'s scaler scales it)."""
        rounds, pool = self.rounds, int(sum(plan.shares))
        first = rounds.stream
        assert first is not None
        if self.closed:
            raise UsageError(f"{self.name} was closed: its deal's store keys are gone")
        check_stream(stream, first + pool, self.broken, self.name)  # every rank: before a wait
        deal = None if self.dealer is None else self.dealer.round(rounds.step, pool, generation)
        self.current = deal

        def ask() -> list[float]:  # the dealing rank: the next unit, -1 once the pool is dealt
            assert deal is not None
            if deal.stop.is_set():  # dealt out, or a worker failed in it (``abandon``, ``broke``)
                return [-1.0]
            k = deal.ask_within()
            return [float(k) if deals(k, pool, cuts_in_flight=False) else -1.0]

        rounds.open(work, pool)
        dealt: list[int] = []
        computed: int | None = 0
        try:
            k = int(self._told(ask, 1)[0])
            while k >= 0:
                if len(dealt) == pool:  # only the pool is dealt: no worker computes more
                    raise TailtrainError(
                        f"{self.name}: the deal's store dealt this worker more than the pool "
                        f"of {pool} in round {rounds.step}: are two jobs sharing its keys?"
                    )
                began = rounds.clock()
                batch = stream[first + k]
                loss = loss_fn(batch)
                backward(loss)  # (FSDP reduce-scatters within the group and accumulates)
                work.times[len(dealt)] = rounds.clock() - began
                dealt.append(k)
                work.loss_sum += float(loss.detach())
                size = batch_samples(batch)
                computed = None if computed is None or size is None else computed + size
                k = int(self._told(ask, 1)[0])  # the next unit: one store round trip
        except BaseException:
            self.fail()
            raise
        rounds.seal(work)
        return computed, dealt

    def leave(self) -> None:
        """Past the round's collectives: this rank's waiter saw the round's stop (set by the
        first ask past the pool, before the round's gather could end), so the round's keys
        may go (module docstring)."""
        if self.current is not None:
            self.current.leave()
            self.current = None

    def fail(self) -> None:
        """The round failed on this rank: its stop is set, so the others stop asking and no
        waiter waits on it again."""
        if self.current is not None:
            self.current.abandon()
            self.current = None

    def broke(self, generation: int) -> None:
        """A lost rank broke the round (before the census): its stop and the next round's in
        ``generation`` are set (``Dealer.broke``)."""
        self.fail()
        if self.dealer is not None:
            self.dealer.broke(generation, self.rounds.step)

    def regrouped(self, broken: int, in_flight: bool, lowest: bool) -> None:
        """After a regroup out of generation ``broken``: the round in flight's keys go with
        the next tidy, and the lowest live rank tidies (rank 0 may be gone)."""
        if self.dealer is not None:
            self.dealer.regrouped(broken, self.rounds.step, in_flight=in_flight)
            self.dealer.tidy = lowest

    def positions(self, agreed: Agreement, pool: int) -> list[list[int]]:
        """The stream positions each worker computed this round (the k-th ask took position
        ``taken + k``); the stream moves on by the pool, every rank alike."""
        rounds = self.rounds
        assert rounds.stream is not None and agreed.dealt is not None
        first = rounds.stream
        rounds.stream = first + pool
        return [[first + int(k) for k in row if k >= 0] for row in agreed.dealt]

    def _told(self, lead: Callable[[], list[float]], size: int) -> np.ndarray:
        """What the worker's dealing rank says (``lead()``: its store calls; the others give
        -1): one all_reduce(MAX) over the worker's group (none for a worker of one rank), the
        store calls and the collective timed as this rank's wait by a probe watching the
        step."""
        if self.within is None:
            return self._waited(lambda: np.asarray(lead(), dtype=np.float64))
        within, values = self.within, [-1.0] * size
        return self._waited(
            lambda: within.reduce_row(
                lead() if self.dealer is not None else values, dist.ReduceOp.MAX
            )
        )

    def _waited(self, wait: Callable[[], Any]) -> Any:
        """``wait()``, its seconds this rank's wait for a probe watching the step."""
        probe, began = watching(self.owner), self.rounds.clock()
        out = wait()
        if probe is not None:
            probe.note_wait(self.rounds.clock() - began)
        return out

    def close(self) -> None:
        """After the last call, on every rank (a barrier over the workers: every rank left
        its last round, its waiter done with the keys): the last rounds' store keys go and
        the dealer's waiter ends. After a failed round there is no barrier (the others may
        be gone). Calls after it are refused."""
        if self.closed:
            return
        self.closed = True
        if not self.broken:
            self.rounds.comm.barrier()
        if self.dealer is not None:
            self.dealer.close()
            self.dealer = None
