"""Reading and checking the numeric parameters of a delay or pattern spec."""

from __future__ import annotations

import math

from tailtrain.errors import UsageError
from tailtrain.spec import Spec


def number(
    spec: Spec,
    key: str,
    default: float | None = None,
    *,
    minimum: float | None = None,
    positive: bool = False,
    maximum: float | None = None,
) -> float:
    """A finite parameter, checked against its bounds; the message names the spec."""
    value = spec.get_float(key, default, minimum=minimum, positive=positive)
    if not math.isfinite(value):
        raise UsageError(f"parameter {key} in {spec.text!r} must be a finite number")
    if maximum is not None and value > maximum:
        raise UsageError(f"parameter {key}={value:g} in {spec.text!r} must be <= {maximum:g}")
    return value


def duration(spec: Spec, key: str, default: float | None = None) -> float:
    """A time in seconds: finite and >= 0."""
    return number(spec, key, default, minimum=0.0)


def positive(spec: Spec, key: str, default: float | None = None) -> float:
    """A rate, scale or shape: finite and > 0."""
    return number(spec, key, default, positive=True)
