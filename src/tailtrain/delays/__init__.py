"""Compute-time models: distributions, worker patterns and the seeded block sampler.

* :func:`parse_delay` — ``const:value=0.45+lognormal:mu=-1.84,sigma=0.83`` → :class:`DelayModel`
* :func:`parse_pattern` — ``subset:s=4,delay=0.46`` → :class:`WorkerPattern`
* :class:`DelayProcess` / :func:`sample_times` — vectorised, seeded durations for the engines
"""

from tailtrain.delays.base import DelayModel, WorkerPattern
from tailtrain.delays.dropcompute_noise import DropComputeNoise
from tailtrain.delays.parse import DISTRIBUTIONS, parse_delay
from tailtrain.delays.patterns import PATTERNS, parse_pattern
from tailtrain.delays.process import DelayProcess, sample_times
from tailtrain.delays.sum import SumDelay
from tailtrain.delays.trace import Trace, TraceDelay, read_trace

__all__ = [
    "DISTRIBUTIONS",
    "PATTERNS",
    "DelayModel",
    "DelayProcess",
    "DropComputeNoise",
    "SumDelay",
    "Trace",
    "TraceDelay",
    "WorkerPattern",
    "parse_delay",
    "parse_pattern",
    "read_trace",
    "sample_times",
]
