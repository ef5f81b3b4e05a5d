"""What reached the parameter server: one delivered piece of work and its gradient, and the
rule's ``ArrivalColumns`` of a list of them (``runtime.ps.server``, ``runtime.ps.lgc``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tailtrain.strategies.base import COLUMNS, ArrivalColumns


@dataclass
class Arrival:
    """One delivered piece of work and its gradient (whole, or r/s of it: ``units``)."""

    worker: int
    job: int
    version: int
    start: float
    finish: float
    grad: torch.Tensor
    loss: float
    units: float = 1.0
    partial: bool = False


def columns(arrivals: list[Arrival]) -> ArrivalColumns:
    if not arrivals:
        return ArrivalColumns.empty()
    return ArrivalColumns(*(np.array([getattr(a, c) for a in arrivals]) for c in COLUMNS))
