"""eager-SGD's collective microbenchmark (eager-SGD §7.1, Fig. 8) in virtual time.

Fig. 8: every iteration, process ``pid`` sleeps ``pid`` ms (``usleep(pid * 1000)``), calls the
collective with ``sendbuff = {1}``, records its latency, then all meet at a barrier. The
allreduce of the ones counts the active processes (NAP). Here the sleep is a worker pattern
(``linear:step=0.001``) on top of an optional compute-time model, each iteration starts at the
barrier, and :func:`~tailtrain.sim.partial.collectives.resolve_round` times the collectives on the
same calls. Majority's initiators come from the rule's shared-seed draw; under direct
activation quorum's counter rotates with the iteration (``counter_of``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tailtrain.delays import DelayProcess
from tailtrain.errors import UsageError
from tailtrain.network import DEFAULT_HOP
from tailtrain.sim.partial.collectives import Network, latencies, resolve_round
from tailtrain.strategies.eager import majority_initiator
from tailtrain.topology.partial import BENCHMARKED, CollectiveStats, activation_hops


@dataclass(frozen=True)
class Microbenchmark:
    """The setup of Fig. 8; ``allreduce`` None means ⌈log2 P⌉ hops (recursive doubling of a
    one-element buffer, latency-bound), ``quorum`` None means ⌈P/2⌉; ``direct`` and ``send``
    as in ``tailtrain.network``."""

    procs: int = 32
    skew: str = "linear:step=0.001"
    iterations: int = 64
    hop: float = DEFAULT_HOP
    allreduce: float | None = None
    quorum: int | None = None
    overhead: float = 0.0
    delay: str = "const:value=0"
    seed: int = 0
    direct: int = 0
    send: float = 0.0

    def __post_init__(self) -> None:
        if self.procs < 1 or self.iterations < 1:
            raise UsageError(
                f"need --procs >= 1 and --iterations >= 1 (got {self.procs}, {self.iterations})"
            )
        if not 1 <= self.quorum_size <= self.procs:
            raise UsageError(f"--quorum {self.quorum} must be between 1 and --procs {self.procs}")
        for name, value in (
            ("--hop-latency", self.hop),
            ("--allreduce-time", self.allreduce),
            ("--call-overhead", self.overhead),
            ("--network send=", self.send),
        ):
            if value is not None and not (np.isfinite(value) and value >= 0):
                raise UsageError(f"{name} must be a finite number of seconds >= 0, got {value}")

    @property
    def quorum_size(self) -> int:
        return -(-self.procs // 2) if self.quorum is None else self.quorum

    @property
    def network(self) -> Network:
        cost = activation_hops(self.procs) * self.hop if self.allreduce is None else self.allreduce
        return Network(self.hop, cost, direct=self.direct, send=self.send)


def run_microbenchmark(bench: Microbenchmark) -> dict[str, CollectiveStats]:
    """Mean latency and NAP of the allreduce, solo, majority and quorum collectives."""
    calls = DelayProcess(bench.delay, bench.skew, bench.seed, bench.procs).next_block(
        bench.iterations
    )
    initiators = np.array(
        [majority_initiator(bench.seed, i, bench.procs) for i in range(bench.iterations)]
    )
    out = {}
    for collective in BENCHMARKED:
        timing = resolve_round(
            calls,
            collective,
            bench.network,
            k=bench.quorum_size,
            initiator=initiators,
            counter=np.arange(bench.iterations),
        )
        waited = latencies(calls, timing, bench.overhead)
        out[collective.value] = CollectiveStats(float(waited.mean()), float(timing.nap.mean()))
    return out
