"""Compute-time models: distributions, worker patterns and the seeded block sampler.

* :func:`parse_delay` — ``const:value=0.45+lognormal:mu=-1.84,sigma=0.83`` → :class:`DelayModel`
* :func:`parse_pattern` — ``subset:s=4,delay=0.46`` → :class:`WorkerPattern`
* :class:`DelayProcess` / :func:`sample_times` — vectorised, seeded durations for the engines
"""

from typing import TYPE_CHECKING

from tailtrain.lazy import lazy_names

#: public name -> the module of this package that defines it, loaded on first use: a rank that
#: needs only ``delays.base`` (its rules' laws) would otherwise import scipy with the samplers
_NAMES: dict[str, str] = {
    "DelayModel": "tailtrain.delays.base",
    "WorkerPattern": "tailtrain.delays.base",
    "DropComputeNoise": "tailtrain.delays.dropcompute_noise",
    "DISTRIBUTIONS": "tailtrain.delays.parse",
    "parse_delay": "tailtrain.delays.parse",
    "PATTERNS": "tailtrain.delays.patterns",
    "parse_pattern": "tailtrain.delays.patterns",
    "DelayProcess": "tailtrain.delays.process",
    "sample_times": "tailtrain.delays.process",
    "SumDelay": "tailtrain.delays.sum",
    "Trace": "tailtrain.delays.trace",
    "TraceDelay": "tailtrain.delays.trace",
    "read_trace": "tailtrain.delays.trace",
}

__getattr__, __dir__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:
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
