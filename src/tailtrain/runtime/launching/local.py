"""A plain function on P local processes: the launcher of the drills and benchmarks.

``tailtrain bench`` (``runtime.drills``) runs a function of its own on every process, not a
``TrainConfig``: no topology entry, no checkpoints, no restarts. It starts the processes as
``tailtrain train`` does (torch's elastic launcher, a static rendezvous on a free port, the
fork server), and a failure is the same one line
(:class:`~tailtrain.runtime.launching.failures.JobFailed`).
"""

from __future__ import annotations

import datetime
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.failures import JobFailed, describe_failure
from tailtrain.runtime.launching.launch import quiet, start_method


def run_local(entry: Callable[[Any], Any], arg: Any, procs: int, timeout: float) -> dict[int, Any]:
    """Run ``entry(arg)`` on ``procs`` local processes forked from the fork server
    (``launching.launch.start_method``: ``entry`` and ``arg`` must pickle), a static
    rendezvous on a free port, no restarts; each joins the gloo group itself. Results by rank."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    endpoint = reserve(Endpoint("127.0.0.1", 0))
    with tempfile.TemporaryDirectory(prefix="tailtrain-bench-") as logs, quiet(False):
        spec = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=procs,
            run_id=f"tailtrain-bench-{uuid.uuid4().hex[:12]}",
            rdzv_backend="static",
            rdzv_endpoint=str(endpoint),
            rdzv_configs={"rank": 0, "timeout": max(1, round(timeout))},
            max_restarts=0,
            monitor_interval=0.1,
            start_method=start_method(False, own_entry=False),
            logs_specs=DefaultLogsSpecs(log_dir=logs),
        )
        try:
            return elastic_launch(spec, entry)(arg)
        except ChildFailedError as exc:
            raise JobFailed(describe_failure(exc)) from None


def join_gloo(timeout: float) -> tuple[int, int]:
    """init_process_group (gloo, env://) with one torch thread; (rank, world size)."""
    torch.set_num_threads(1)
    span = datetime.timedelta(seconds=timeout)
    dist.init_process_group("gloo", init_method="env://", timeout=span)
    return dist.get_rank(), dist.get_world_size()
