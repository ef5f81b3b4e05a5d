"""``--comm-time``: T^c as seconds or a delay spec (per job on a parameter server, per update
for an allreduce, per collective for eager-SGD; docs/cli.md, Specs)."""

from __future__ import annotations

import math

from tailtrain.delays.base import DelayModel
from tailtrain.delays.parse import parse_delay
from tailtrain.errors import UsageError


def parse_comm_time(text: str | None) -> DelayModel | None:
    """A number of seconds (a constant model) or a delay spec; ``None`` means no comm time."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        return parse_delay(text)
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(f"--comm-time {text!r} must be finite seconds >= 0 or a delay spec")
    return parse_delay(f"const:value={seconds!r}")
