"""``tailtrain store``: the job's store in a process of its own (``runtime.launching.nodes``,
``--store apart``), so that losing any node, the first included, leaves the job going.

It serves a ``TCPStore`` on the address given only, writes the job's run id, and serves as
long as the job runs: it ends once every node ended or was lost (no launcher beat for
``--timeout`` seconds), or ``--timeout`` seconds after a node's ranks finished
(``nodes.await_job_end``), or on Ctrl-C. It holds no state of the training: a job whose
store is lost ends, as under torchrun.
"""

from __future__ import annotations

import datetime
import logging

from tailtrain.runtime.launching.endpoint import Endpoint
from tailtrain.runtime.launching.nodes import await_job_end, host_store, open_run

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
    return await_job_end(store, run, nnodes, timeout, asked=lambda: False)
