"""Local-SGD, optionally with DropCompute on top (DropCompute App. B.3).

Each worker takes H = ``period`` local SGD steps on its own copy of the model, then the copies
are averaged by an allreduce: theta <- (1/N) sum_n theta_n. One round (one record row, one
``--iterations`` unit) is H local steps and one average.

With a threshold (``threshold=SECONDS|auto`` or ``drop-rate=p``, as in ``dropcompute``) the
compute time since the last average is compared with tau at each local step, "leveraging
periodic synchronization instead of gradient accumulations" (App. B.3: "comparing the compute
time with a threshold at each local step"): a worker past tau skips its remaining local steps
and joins the average with the model it has. So the check runs between units by default
(``stop=between``: the local step in flight finishes and counts); ``stop=preempt`` stops a
worker in the middle of a local step, as DropCompute's Algorithm 1 does inside one step.
Without a threshold (the default) nothing is dropped, and H = 1 is synchronous SGD.
"""

from __future__ import annotations

from tailtrain.errors import UsageError
from tailtrain.spec import Spec
from tailtrain.strategies.dropcompute import KEYS, DropCompute, parse_options


def build_local_sgd(spec: Spec) -> DropCompute:
    """``local-sgd:period=H[,threshold=...,drop-rate=...,calibrate=...,...]``."""
    spec.require_known(("period", *KEYS))
    period = spec.get_int("period", minimum=1)
    options = parse_options(spec, default="inf", stop="between")
    if options["compensate"] == "larger-batch":
        raise UsageError(
            f"{spec.text!r}: compensate=larger-batch applies to micro-batches of one step; "
            "with local SGD use extra-steps or resample"
        )
    return DropCompute(name="local-sgd", text=spec.text, period=period, **options)
