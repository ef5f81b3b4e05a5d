"""``tailtrain store``: the job's store in a process of its own (``runtime.launching.nodes``,
``--store apart``), so that losing any node, the first included, leaves the job going.

It serves a ``TCPStore`` on the address given only, writes the job's run id, and ends once
every node's launcher said it ended, or ``--timeout`` seconds after the first did (a node
that was lost never says so), or on Ctrl-C. It holds no state of the training: a job whose
store is lost ends, as under torchrun. Every wait is bounded.
"""

from __future__ import annotations

import datetime
import logging
import time

from tailtrain.runtime.launching.endpoint import Endpoint
from tailtrain.runtime.launching.nodes import END_POLL, LAUNCH_KEYS, host_store, open_run

log = logging.getLogger(__name__)


def serve_store(endpoint: Endpoint, nnodes: int, timeout: float) -> str:
    """Host the job's store at ``endpoint`` until the job ended (module docstring); returns
    the line that says how it ended. Ctrl-C raises ``KeyboardInterrupt`` to the caller."""
    store = host_store(endpoint, datetime.timedelta(seconds=timeout))
    run = open_run(store)
    where = Endpoint(endpoint.host, store.port)
    log.warning(
        "tailtrain store: job %s at %s for %d nodes (a c10d store is unauthenticated: keep it "
        "on a private network); Ctrl-C ends it",
        run, where, nnodes,
    )  # fmt: skip
    ended_key, first_end = f"{LAUNCH_KEYS}/{run}/ended", None
    while True:
        ended = store.add(ended_key, 0)
        if ended >= nnodes:
            return f"every node's launcher ended ({ended} of {nnodes})"
        if ended and first_end is None:
            first_end = time.monotonic()
        if first_end is not None and time.monotonic() > first_end + timeout:
            late = f"no other did within --timeout {timeout:g}s"
            return f"{ended} of {nnodes} launchers ended; {late}"
        time.sleep(END_POLL)
