"""The partial collective's wire: how its messages and its round's buffer are written and read.

The protocol (``runtime.partial.collective``: the round states, who activates, the calls)
sends two things, both laid out here:

* a **message** on the activation group: three int64 ``[kind, a, sender]``, of the kinds
  ``ACT``, ``CALL``, ``STOP`` and ``ABORT`` (:func:`encode_message`, :func:`decode_message`);
* a round's **allreduce buffer**, float64
  ``[sum g (D), sum of fresh g (D), slots (P, len(HEAD) + capacity * len(SLOT_COLUMNS))]``:
  every process adds its taken gradients and writes its own slot (its ``HEAD``: initiated,
  activation time, snapshot time, rows; then a row per gradient, ``SLOT_COLUMNS``) with zeros
  elsewhere (:func:`pack_round`), so one SUM gives every rank the same arrivals, read back as
  a :class:`RoundResult` (:func:`unpack_round`).

The SUM itself goes by recursive doubling for a small CPU buffer (:func:`recursive_doubling`),
and the ranks agree on one clock origin per machine (:func:`shared_origin`).
"""

from __future__ import annotations

import socket
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from tailtrain.strategies.base import ArrivalColumns
from tailtrain.strategies.eager import RoundPlan

ACT, CALL, STOP, ABORT = 1, 2, 3, 4
#: columns of one contributed gradient's row; ``adopted``: the round its rank had adopted last
#: when it computed it (-1: none since its start or its last regroup), from which a shrinking
#: run's parameters can be rebuilt (``runtime.partial.regroup``); ``screened``: 1 when its rank
#: screened it out as non-finite (``core.update.screen_own``), so it joined the sum as zeros
SLOT_COLUMNS = ("job", "version", "start", "finish", "loss", "gsq", "adopted", "screened")
#: where ``screened`` stands in :attr:`RoundResult.rows` (after the worker column)
SCREENED = 1 + SLOT_COLUMNS.index("screened")
#: a slot's head; ``grow``: the rank saw a rank ask to join (``runtime.partial.regroup``)
HEAD = ("initiated", "activated", "snapshot", "rows", "grow")
#: buffers up to this size are summed by recursive doubling (latency-bound), larger by gloo's ring
RECURSIVE_DOUBLING_BYTES = 1 << 18


def encode_message(kind: int, value: int, sender: int) -> torch.Tensor:
    return torch.tensor([kind, value, sender], dtype=torch.int64)


def empty_message() -> torch.Tensor:
    """A receive buffer for one message."""
    return torch.zeros(3, dtype=torch.int64)


def decode_message(message: torch.Tensor) -> tuple[int, int, int]:
    """``(kind, value, sender)`` of a received message."""
    kind, value, sender = (int(v) for v in message)
    return kind, value, sender


def slot_width(capacity: int) -> int:
    """Floats in one process's slot when it contributes at most ``capacity`` gradients."""
    return len(HEAD) + capacity * len(SLOT_COLUMNS)


def pack_round(
    dim: int,
    procs: int,
    width: int,
    rank: int,
    grads: Sequence[tuple[torch.Tensor, bool]],
    head: Sequence[float],
    rows: Sequence[np.ndarray],
) -> torch.Tensor:
    """This rank's contribution to a round: the sum of its taken gradients, the sum of those
    that are fresh (``(grad, fresh)`` pairs), and its slot (``head`` and one row each)."""
    d = dim
    payload = torch.zeros(2 * d + procs * width, dtype=torch.float64)
    for grad, fresh in grads:
        payload[:d] += grad.double()
        if fresh:
            payload[d : 2 * d] += grad.double()
    flat = np.concatenate(list(rows)) if len(rows) else np.zeros(0)
    at = 2 * d + rank * width
    payload[at : at + len(HEAD)] = torch.tensor(list(head), dtype=torch.float64)
    payload[at + len(HEAD) : at + len(HEAD) + flat.size] = torch.from_numpy(flat)
    return payload


def unpack_round(
    index: int, plan: RoundPlan, payload: torch.Tensor, dim: int, procs: int, done: float
) -> RoundResult:
    """The summed buffer of round ``index`` (on the CPU) as every rank reads it."""
    d = dim
    slots = payload[2 * d :].numpy().reshape(procs, -1).copy()
    return RoundResult(index, plan, payload[:d].clone(), payload[d : 2 * d].clone(), slots, done)


@dataclass(frozen=True)
class RoundResult:
    """What every rank knows after round ``index``: the summed gradients and the slots."""

    index: int
    plan: RoundPlan
    total: torch.Tensor  # sum of every contributed gradient
    fresh: torch.Tensor  # sum of the fresh (this round's step) gradients
    slots: np.ndarray  # (P, len(HEAD) + capacity * len(SLOT_COLUMNS))
    done: float  # when this rank's allreduce returned

    @property
    def rows(self) -> np.ndarray:
        """(n, 1 + len(SLOT_COLUMNS)) contributed gradients: worker, then the slot's columns."""
        p, cap = len(self.slots), (self.slots.shape[1] - len(HEAD)) // len(SLOT_COLUMNS)
        table = self.slots[:, len(HEAD) :].reshape(p, cap, len(SLOT_COLUMNS))
        have = np.arange(cap)[None, :] < self.slots[:, 3, None]
        worker = np.broadcast_to(np.arange(p)[:, None], (p, cap))[have]
        return np.column_stack([worker, table[have]])

    @property
    def screened(self) -> np.ndarray:
        """Aligned with :attr:`rows`: whether each gradient was screened out (not in the sum)."""
        return self.rows[:, SCREENED] > 0

    def arrivals(self) -> ArrivalColumns:
        rows = self.rows
        return ArrivalColumns(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], rows[:, 4])

    @property
    def grow(self) -> bool:
        """Whether a rank said, in this round, that a rank asks to join (a heal)."""
        return bool((self.slots[:, 4] > 0).any())

    @property
    def initiators(self) -> np.ndarray:
        return np.flatnonzero(self.slots[:, 0] > 0)

    @property
    def active(self) -> np.ndarray:
        """Ranks that contributed a gradient of this round's step (NAP = their number)."""
        rows = self.rows
        return np.unique(rows[rows[:, 2] == self.index, 0].astype(np.int64))

    @property
    def reach(self) -> float:
        """When the activation had reached every process."""
        return float(self.slots[:, 1].max())

    @property
    def activation(self) -> float:
        return float(self.slots[:, 1].min())

    @property
    def closed(self) -> float:
        """The round's time, identical on every rank: the last snapshot of a send buffer."""
        return float(self.slots[:, 2].max())


def machine_id() -> int:
    """Which monotonic clock this process reads: the host and, on Linux, the boot (32 bits)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text()
    except OSError:
        boot = ""
    return zlib.crc32(f"{socket.gethostname()}/{boot}".encode())


def shared_origin(group) -> float:
    """The time origin of this rank's clock: rank 0's reading after the start barrier where
    this rank reads the same monotonic clock (``perf_counter``: CLOCK_MONOTONIC on Linux, one
    per machine), so activation times compare across ranks; else its own reading."""
    mine = time.perf_counter()
    stamp = torch.tensor([mine, float(machine_id())], dtype=torch.float64)
    opts = dist.BroadcastOptions()  # the group's own: a generation's is unknown to dist
    opts.rootRank = 0
    group.broadcast([stamp], opts).wait()
    return float(stamp[0]) if int(stamp[1]) == machine_id() else mine


def recursive_doubling(x: torch.Tensor, rank: int, procs: int, group) -> torch.Tensor:
    """SUM-allreduce of ``x`` over ``group`` (every rank of the job) in ⌈log2 P⌉ exchanges
    (Thakur et al., recursive doubling; the first 2(P - 2^m) ranks fold in pairs first, so any
    P costs two more hops). Both partners of an exchange add the same two values, so every
    rank ends with bitwise the same sum."""
    p2 = 1 << (procs.bit_length() - 1)
    extra = procs - p2
    other = torch.empty_like(x)
    if rank < 2 * extra and rank % 2 == 0:  # folds into rank + 1, gets the sum back
        group.send([x], rank + 1, 0).wait()
        group.recv([x], rank + 1, 0).wait()
        return x
    if rank < 2 * extra:
        group.recv([other], rank - 1, 0).wait()
        x.add_(other)
    me = rank // 2 if rank < 2 * extra else rank - extra
    mask = 1
    while mask < p2:
        peer_index = me ^ mask
        peer = 2 * peer_index + 1 if peer_index < extra else peer_index + extra
        sending = group.send([x], peer, 0)
        group.recv([other], peer, 0).wait()
        sending.wait()
        x.add_(other)
        mask <<= 1
    if rank < 2 * extra:
        group.send([x], rank - 1, 0).wait()
    return x


def row(
    job: int,
    version: int,
    start: float,
    finish: float,
    loss: float,
    gsq: float,
    adopted: int = -1,
    screened: bool = False,
) -> np.ndarray:
    """One contributed gradient's row (``SLOT_COLUMNS``); ``screened``: it is zeros in the sum."""
    columns = [job, version, start, finish, loss, gsq, adopted, float(screened)]
    return np.array(columns, dtype=np.float64)
