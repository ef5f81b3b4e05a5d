"""The scenario's network: properties of the interconnect, never of a strategy's rule.

``--network hop=SECONDS,overhead=SECONDS[,allreduce=SECONDS,direct=D,send=SECONDS]``:

- ``hop``: latency of one point-to-point activation message of a partial collective; the
  activation reaches every process in ⌈log2 P⌉ hops (eager-SGD §4.1.1). Default 1.5 µs, an
  Aries-class small-message latency (the paper gives none).
- ``direct``: up to this many processes the activation goes straight from the initiator to
  every other process, one hop of P - 1 messages sent one after another, as
  ``runtime.partial.collective`` does up to its ``DIRECT_ACTIVATION`` (8); default 0: always
  ⌈log2 P⌉ hops, the paper's scale. To compare ``simulate`` with ``train`` at P <= 8, give
  ``direct=8``.
- ``send``: under direct activation, the initiator's cost of issuing one message: its m-th
  message (ranks in ascending order, itself skipped) arrives ``m * send + hop`` after the
  activation (default 0).
- ``overhead``: the software cost every collective call pays, even when its result is ready
  (fflib2's per-call cost, which eager-SGD's Fig. 9 ratios imply; default 0).
- ``allreduce``: duration of one allreduce of the collective microbenchmark's one-element
  buffer (default: ⌈log2 P⌉ hops, recursive doubling). In training the allreduce of gradients
  takes ``--comm-time`` instead, which is a per-update communication cost.

``tailtrain bench collectives`` measures these on real processes and writes them in this form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tailtrain.errors import UsageError
from tailtrain.spec import Spec, parse_spec

#: Aries small-message latency order of magnitude; eager-SGD gives no figure
DEFAULT_HOP = 1.5e-6
NETWORK_KEYS = ("hop", "overhead", "allreduce", "direct", "send")


@dataclass(frozen=True)
class NetworkModel:
    """Latencies of the interconnect, in seconds; ``allreduce`` None means ⌈log2 P⌉ hops;
    ``direct`` the largest P activated in one hop (0: none)."""

    hop: float = DEFAULT_HOP
    overhead: float = 0.0
    allreduce: float | None = None
    direct: int = 0
    send: float = 0.0

    def spec(self) -> str:
        """The ``--network`` text that gives this model back."""
        parts = [f"hop={self.hop!r}", f"overhead={self.overhead!r}"]
        if self.allreduce is not None:
            parts.append(f"allreduce={self.allreduce!r}")
        if self.direct:
            parts.append(f"direct={self.direct}")
        if self.send:
            parts.append(f"send={self.send!r}")
        return ",".join(parts)


def parse_network(text: str | None) -> NetworkModel:
    """``hop=,overhead=,allreduce=,send=`` (seconds >= 0) and ``direct=`` (processes >= 0), any
    subset; None gives the defaults."""
    if text is None or not text.strip():
        return NetworkModel()
    spec = parse_spec(f"network:{text}", what="--network")
    unknown = sorted(set(spec.params) - set(NETWORK_KEYS))
    if unknown:
        raise UsageError(
            f"--network {text!r}: unknown key {unknown[0]!r}; it takes {', '.join(NETWORK_KEYS)} "
            "(seconds each, direct= a process count), e.g. --network hop=2e-6,overhead=1e-4"
        )
    return NetworkModel(
        hop=_seconds(spec, "hop", DEFAULT_HOP),
        overhead=_seconds(spec, "overhead", 0.0),
        allreduce=_seconds(spec, "allreduce") if spec.has("allreduce") else None,
        direct=spec.get_int("direct", 0, minimum=0),
        send=_seconds(spec, "send", 0.0),
    )


def _seconds(spec: Spec, key: str, default: float | None = None) -> float:
    value = spec.get_float(key, default, minimum=0.0)
    if not math.isfinite(value):
        raise UsageError(f"--network {key}={value}: give finite seconds >= 0")
    return value


def moved_to_network(key: str, value: str, rule: str) -> UsageError:
    """The one-line error for a network property still written in a strategy spec."""
    return UsageError(
        f"{rule!r}: {key}= is a property of the network, not of the strategy; "
        f"write --network {key}={value} instead"
    )
