"""The machine a trace was measured on: its cores, the job's ranks there and its load (issue 36).

When ranks outnumber the cores they run on, a rank that waits leaves its core to another;
a remedy that stops ranks waiting (Local-SGD, DropCompute, rebalance) makes them contend
for the cores instead, and its micro-batches get slower than the trace's (the advise bench
measured 1.14-1.29x sync's under Local-SGD at a load of 3 on 2 cores). A trace alone cannot
show that, so ``train`` (rank 0, at the end) and the probe (rank 0, at a run's first write)
append a row to ``machine.jsonl`` beside ``trace.csv``:
``{"run", "host", "cores", "local_ranks", "load"}``: the cores this process may run on
(``os.sched_getaffinity``), the job's ranks on this host (``LOCAL_WORLD_SIZE``, as torchrun and
``tailtrain launch`` set it), and the 1, 5 and 15-minute load averages (``os.getloadavg``);
``train`` adds ``asleep``, the share of its units' seconds that were injected sleeps, and
``cut: false`` when a threshold could not cut them; the probe adds ``cut: false`` (a user's
step is never cut once begun; ``delays.trace.cuttable_units``).
Rank 0's host stands for the job's: on several hosts, the others are not seen.

A trace's censored rows are completed under processor sharing of the row's cores
(``delays.contention``, through ``trace:`` reading this file) when the row's host ran all
the trace's workers and its units were not mostly sleeps (a sleeping rank holds no core).
``advise``'s forecasts of the remedies model no contention; :func:`contention_note` says so
in one line, with by how much the trace's machine was oversubscribed, when its ranks or its
load outnumbered its cores.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

MACHINE_FILE = "machine.jsonl"  #: beside ``trace.csv``
#: local ranks one machine may start: at most this many, and this many per CPU core (each
#: rank is a whole Python process with its own copy of torch)
MAX_LOCAL_WORKERS = 64
WORKERS_PER_CORE = 8


def max_local_workers() -> int:
    """The most ranks ``train`` or ``launch`` starts on this machine."""
    return min(MAX_LOCAL_WORKERS, (os.cpu_count() or 1) * WORKERS_PER_CORE)


def machine_row(run: int = 0, local_ranks: int | None = None) -> dict[str, Any]:
    """This host's row (module docstring) for run ``run``; ``local_ranks`` None: read from
    ``LOCAL_WORLD_SIZE`` (1 when unset: a single process)."""
    if local_ranks is None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return {
        "run": int(run),
        "host": socket.gethostname(),
        "cores": len(os.sched_getaffinity(0)),
        "local_ranks": int(local_ranks),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def append_machine(folder: str | Path, row: dict[str, Any]) -> None:
    """Append ``row`` to ``folder``'s ``machine.jsonl`` (earlier runs' rows are kept)."""
    with open(Path(folder) / MACHINE_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def read_machine(folder: str | Path, run: int) -> dict[str, Any] | None:
    """Run ``run``'s last row in ``folder``'s ``machine.jsonl``, or None (no file, no row)."""
    path = Path(folder) / MACHINE_FILE
    if not path.is_file():
        return None
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash says nothing
            continue
        if isinstance(row, dict) and row.get("run", 0) == run:
            rows.append(row)
    return rows[-1] if rows else None


def oversubscription(row: dict[str, Any]) -> float:
    """How many times over its cores the trace's host was asked for: the larger of its
    ranks and its load (the 1 and 5-minute averages) per core."""
    cores = max(int(row.get("cores", 1)), 1)
    load = max([float(x) for x in row.get("load", [0.0])[:2]] or [0.0])
    return max(int(row.get("local_ranks", 1)), load) / cores


def contention_note(row: dict[str, Any] | None) -> str | None:
    """The one-line warning when the trace's machine was oversubscribed (module docstring),
    else None."""
    if row is None or oversubscription(row) <= 1.0:
        return None
    load = ", ".join(f"{x:g}" for x in row.get("load", [])[:2])
    return (
        f"contention: the trace's host {row.get('host', '?')} ran {row.get('local_ranks')} "
        f"ranks on {row.get('cores')} cores at a load of {load} "
        f"({oversubscription(row):.1f}x oversubscribed); the forecast assumes no contention, "
        "and a remedy that stops ranks waiting makes them share the cores, so its gain may "
        "read high"
    )
