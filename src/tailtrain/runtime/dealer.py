"""The store's side of a step dealt on demand (``rebalance:deal=demand``, issue 25): who asks
for which micro-batch, when the step's pool is complete, and the keys that hold it.

Three callers deal with it: the allreduce wing's rounds (``runtime.allreduce.demand``, each
rank for itself, its units' injected sleeps cut when the pool completes), and a loop's
``StragglerStep`` and ``ShardedStep`` (``integrate.demand``: each rank, or each replica group's
first rank for its group, the pool alone).

A rank asks for its next micro-batch with ``add`` on the round's ask counter (the k-th ask
takes the round's k-th micro-batch). In the allreduce wing it reports each finished one with
``add`` on the round's completion counter, and the completion that makes the count the pool
sets the round's stop key; a loop's step, whose every dealt unit counts, reports none, and
its first ask past the pool sets the stop (:meth:`DealtRound.ask_within`). Each rank's waiter
thread, blocked on that key, wakes its round's stop event.

The store is the rendezvous's TCPStore (``MASTER_ADDR:MASTER_PORT``, env://), under a prefix
of this run and restart (and of the caller: ``Dealer.open``'s ``prefix``); each rank holds
two clients: one for its counters, one for the waiter, whose blocking wait would hold a
shared socket. A rank leaves a round only once its waiter has seen the round's stop (a
bounded wait). A caller may leave a round only after its closing collective (``integrate.demand``:
a loop's step), so one rank may start round s + 1 while another's waiter is still to read
round s's stop key: the tidy rank deletes a round's three keys two rounds later, once every
rank has started the round after it, and the store holds two rounds' keys whatever the run's
length. :meth:`Dealer.close` deletes the last round's and ends the waiter. A rank
that fails in a round sets its stop (:meth:`DealtRound.abandon`), so the others stop asking.

Under ``--on-rank-loss shrink`` a round's keys are its generation's and step's
(``{generation}/{step}/``): :meth:`Dealer.broke` and :meth:`Dealer.regrouped` are that part
(``runtime.allreduce.demand`` tells the protocol).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import threading
from typing import Any

import torch.distributed as dist


def store_prefix(env: Any = os.environ) -> str:
    """This run's keys of the deal in the rendezvous store."""
    run = env.get("TORCHELASTIC_RUN_ID", "local")
    return f"tailtrain/deal/{run}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


class Dealer:
    """This rank's side of the deal: the round's counters and the waiter for its stop."""

    def __init__(
        self, counters: dist.Store, waits: dist.Store, tidy: bool = False, timeout: float = 300.0
    ) -> None:
        self.counters, self.tidy, self.timeout = counters, tidy, timeout
        #: rounds dealt since the last one started, and those before them, whose keys go when
        #: the next round starts (the tidy rank): every rank is past them then
        self._past: list[str] = []
        self._older: list[str] = []
        #: after each regroup that broke a round in flight: the micro-batches it had dealt
        self.redone: list[int] = []
        self._rounds: queue.SimpleQueue[
            tuple[str, threading.Event, threading.Event, threading.Event] | None
        ]
        self._rounds = queue.SimpleQueue()
        self.waiter = threading.Thread(target=self._wait, args=(waits,), daemon=True)
        self.waiter.start()

    @classmethod
    def open(
        cls, timeout: datetime.timedelta, tidy: bool, env: Any = os.environ, prefix: str = ""
    ) -> Dealer:
        """Two clients of the rendezvous store (module docstring); ``tidy``: this rank (one
        of the run's) deletes each round's counters once every rank is past it; ``prefix``
        sets apart the keys of one dealer of several in a job (``integrate.sharded``)."""
        host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])

        def client() -> dist.Store:
            base = dist.TCPStore(host, port, is_master=False, timeout=timeout)
            return dist.PrefixStore(store_prefix(env) + prefix, base)

        return cls(client(), client(), tidy, timeout.total_seconds())

    def _wait(self, waits: dist.Store) -> None:
        """Rounds in order: block until a round's stop key is set, then wake its events (the
        stop, and ``seen``: this thread is done with the key). A rank leaves a round only
        once its ``seen`` is set, so the next round never waits behind it. --timeout bounds
        each wait, not the round: a wait that times out while this rank still computes the
        round waits again (a round may outlast --timeout, as a sync round's compute may;
        taking the timeout for the stop cut every such round short). Once the rank left the
        round, or the store failed otherwise (gone), the round is woken: its allreduce then
        meets the failure, bounded as every collective is. None: the run is over."""
        while (item := self._rounds.get()) is not None:
            key, stop, seen, ended = item
            while True:
                try:
                    waits.wait([key])
                except dist.DistStoreError:  # --timeout passed: again while the round runs
                    if not ended.is_set():
                        continue
                except Exception:  # the store failed (gone): the allreduce will too
                    pass
                break
            stop.set()
            seen.set()

    def round(self, step: int, pool: int, generation: int = 0) -> DealtRound:
        """Round ``step``'s counters for ``pool`` (N M) completions in ``generation`` (module
        docstring), its stop watched from now on."""
        # every rank passed the last round's allreduce (or the census after it broke)
        self._forget()
        stop, seen, ended = threading.Event(), threading.Event(), threading.Event()
        key = f"{generation}/{step}/"
        self._rounds.put((key + "stop", stop, seen, ended))
        self._past.append(key)
        return DealtRound(self.counters, key, pool, stop, seen, ended, self.timeout)

    def broke(self, generation: int, step: int) -> None:
        """Round ``step`` of ``generation`` broke (a rank was lost): its stop and the next
        round's are set, so no waiter waits on them and a member one round ahead stops
        dealing (module docstring). Before the census: every member has done it before any
        deletes the keys."""
        for ahead in (0, 1):
            with contextlib.suppress(Exception):  # the store is the launcher's: bounded
                self.counters.set(f"{generation}/{step + ahead}/stop", "1")

    def regrouped(self, generation: int, step: int, in_flight: bool = True) -> int:
        """After a regroup that left ``generation`` with round ``step`` to run: the
        micro-batches that round had dealt there (``in_flight``: it broke; a grow is at a step
        boundary, 0), dealt again now, kept in :attr:`redone`; its keys and its neighbours'
        go with the next round's tidy (a member one round behind or ahead set their stops,
        :meth:`broke`)."""
        prefixes = [f"{generation}/{s}/" for s in (step, step - 1, step + 1) if s >= 0]
        dealt = int(self.counters.add(prefixes[0] + "asks", 0)) if in_flight else 0
        self._past += [p for p in prefixes if p not in self._past]
        self.redone.append(dealt)
        return dealt

    def _forget(self, every: bool = False) -> None:
        """The tidy rank deletes the keys of the rounds every rank is past: every rank left
        them, and every waiter saw their stop (:meth:`DealtRound.leave`, :meth:`broke`), so
        nobody reads them again. A round's keys go when the round two after it starts (module
        docstring); ``every``: the run is over, every round's go."""
        gone, self._older, self._past = self._older, self._past, []
        if every:
            gone, self._older = gone + self._older, []
        if self.tidy:
            for prefix in gone:
                for key in ("asks", "done", "stop"):
                    self.counters.delete_key(prefix + key)

    def close(self) -> None:
        """After the run's last round, every rank past it (the last round's settling
        all-gather): the last rounds' keys go (the tidy rank) and the waiter ends."""
        self._forget(every=True)
        self._rounds.put(None)
        self.waiter.join(self.timeout)


class DealtRound:
    """One round's deal as this rank sees it (:class:`Dealer`)."""

    __slots__ = ("counters", "ended", "key", "pool", "seen", "stop", "timeout")

    def __init__(
        self,
        counters: dist.Store,
        key: str,
        pool: int,
        stop: threading.Event,
        seen: threading.Event,
        ended: threading.Event,
        timeout: float,
    ) -> None:
        self.counters, self.key, self.pool, self.stop = counters, key, pool, stop
        #: the waiter is done with the round's stop key; this rank computes no more of it
        self.seen, self.ended, self.timeout = seen, ended, timeout

    def ask(self) -> int:
        """The index of this rank's next micro-batch in the round's stream."""
        return int(self.counters.add(self.key + "asks", 1)) - 1

    def ask_within(self) -> int:
        """:meth:`ask` where the pool is dealt alone and a unit cannot be cut (a loop's step:
        ``integrate.demand``): the first ask past the pool sets the round's stop, since every
        unit dealt will be computed and counts; no completion is reported (one round trip a
        unit)."""
        k = self.ask()
        if k == self.pool:
            self.counters.set(self.key + "stop", "1")
            self.stop.set()
        return k

    def complete(self) -> bool:
        """Report a finished unit: whether it counts (one of the first N M); the N M-th
        sets the stop."""
        count = int(self.counters.add(self.key + "done", 1))
        if count == self.pool:
            self.counters.set(self.key + "stop", "1")
            self.stop.set()
        return count <= self.pool

    def abandon(self) -> None:
        """This rank leaves the round on a failure: its stop is set (bounded: the store is
        the launcher's), so the other ranks stop asking and leave it, and this rank's waiter
        stops waiting again for it (:meth:`Dealer.broke`'s part for one round)."""
        with contextlib.suppress(Exception):
            self.counters.set(self.key + "stop", "1")
        self.stop.set()
        self.ended.set()

    def leave(self) -> None:
        """Wait (up to twice --timeout: a wait of the waiter's may have just begun) until
        this rank's waiter saw the round's stop key: the tidy rank deletes it when the round
        two after this one starts (:meth:`Dealer.round`). The stop was set before this rank
        left (the N M-th completion, or a loop's first ask past the pool, came before the
        round's collective ended): a round trip or so."""
        self.ended.set()
        self.seen.wait(2 * self.timeout)

    def sleep(self, seconds: float) -> bool:
        """Sleep a unit's injected seconds unless the round stops first: whether it stopped."""
        if seconds <= 0:
            return self.stop.is_set()
        return self.stop.wait(seconds)
