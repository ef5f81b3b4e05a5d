"""A round dealt on demand on real ranks (``rebalance:deal=demand``, issue 25).

The simulator decides the deal on its virtual clock (``strategies.rebalance.on_demand``); here
the run's store decides it, in the order the ranks reach it: a rank asks for its next
micro-batch with ``add`` on the round's ask counter (the k-th ask takes the round's k-th
micro-batch: the carried ones, then fresh ones of the stream, ``RoundData``), computes it,
sleeps its injected seconds and reports it with ``add`` on the round's completion counter.
The completion that makes the count N M sets the round's stop key; every rank then stops at
once, its unit in flight cut (a waiter thread blocks on the key and wakes the injected
sleep), and a completion counted after N M is cut too. Every unit a rank was dealt is in
the round's gathered rows, so every rank carries the same cut micro-batches to the next
round (``RoundData.on_demand``, the simulator's) and the record row says which each rank
computed.

The store's side (the counters, the stop key and its waiter, the keys' tidy) is
``runtime.dealer``'s, which ``ShardedStep`` shares.

Under ``--on-rank-loss shrink`` a round's keys are its generation's and step's
(``{generation}/{step}/``): the round in flight when a rank was lost is redone by the next
generation under keys of its own, so no counter of the broken round reaches it. A rank
that meets the break sets the stop of its round and of the next one in its generation
(:meth:`Dealer.broke`): a waiter on either wakes, and a member already past the broken
allreduce (it is one round ahead) stops dealing itself the pool alone. After the regroup
rank 0 reads how many micro-batches the broken round had dealt (computed again now: the
only work done twice) and deletes its keys with a later round's tidy
(:meth:`Dealer.regrouped`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch

from tailtrain.runtime.dealer import DealtRound
from tailtrain.runtime.grads import ModuleGrads
from tailtrain.runtime.units import RankWork
from tailtrain.topology.allreduce import worker_grad


def compute_on_demand(
    grads: ModuleGrads,
    theta: torch.Tensor,
    deal: DealtRound,
    batch_of: Callable[[int], np.ndarray],
    injected: np.ndarray,
    out: torch.Tensor | None = None,
) -> tuple[RankWork, list[int]]:
    """This rank's units of a round dealt on demand (module docstring): ask, compute the dealt
    micro-batch (``batch_of(k)``), sleep its injected seconds, report it; until the round
    stops. Returns the work (G_n over the counted units) and the index of every unit it was
    dealt, in order; the counted ones are the first ``done``."""
    seconds_of = injected.tolist()
    times, dealt = [math.nan] * len(seconds_of), []
    done, loss_sum, slept, cut, whole = 0, 0.0, 0.0, math.nan, False
    total: torch.Tensor | None = None
    start = time.perf_counter()
    try:
        for u, seconds in enumerate(seconds_of):
            if deal.stop.is_set():
                break
            k = deal.ask()
            dealt.append(k)
            began = time.perf_counter()
            loss, grad = grads(theta, batch_of(k), out if u == 0 else None)
            asleep = time.perf_counter()
            stopped = deal.sleep(seconds)
            slept += (time.perf_counter() - asleep) if stopped else seconds
            if stopped or not deal.complete():  # cut in flight, or counted past N M: carried
                cut = time.perf_counter() - began
                # it ran to its end (no sleep to stop): its time, not a bound
                whole = not stopped or seconds <= 0
                break
            times[u] = time.perf_counter() - began
            done += 1
            loss_sum += loss
            total = grad if total is None else total.add_(grad)
    except BaseException:
        deal.ended.set()  # the waiter stops waiting again for a round this rank left
        raise
    deal.leave()
    total = torch.zeros_like(theta) if total is None else total
    grad = worker_grad(total, done, 1)
    work = RankWork(done, time.perf_counter() - start, slept, times, grad, loss_sum, cut, whole)
    return work, dealt
