"""The parameter server's state as its helper modules see it: :class:`ServerState`, what
``keep`` (checkpoints) and ``lgc`` (a step's deferred term) read and change, and
:class:`Pending`, an LGC step awaiting its stragglers' blocks. ``server.Server`` is the one
implementation; the helpers name this protocol, not the host, so they sit below it (no
import circle in ``runtime/``, issue 35 item 5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from tailtrain.core.evaluation import Evaluator
    from tailtrain.core.records import RunRecord
    from tailtrain.core.update import WeightedUpdate
    from tailtrain.runtime.config import TrainConfig
    from tailtrain.runtime.control import RuleDriver
    from tailtrain.runtime.ps.arrivals import Arrival
    from tailtrain.runtime.ps.liveness import Liveness
    from tailtrain.strategies.base import Strategy, Weighting
    from tailtrain.topology.ps import Schedule


@dataclass
class Pending:
    """LGC: step t's stragglers (worker -> (job, start)) whose blocks make e_t."""

    state: Any
    fresh: list[Arrival]
    now: Weighting
    waiting: dict[int, tuple[int, float]]
    version: int
    close: float
    row: dict[str, Any]
    complete: bool
    blocks: int
    reports: list[Arrival] = field(default_factory=list)


class ServerState(Protocol):
    """The server's run: its rule and update path, the model versions in force, the record
    and evaluator, each worker's job, the token queue, and where the clock and steps stand."""

    config: TrainConfig
    strategy: Strategy
    rule: RuleDriver
    update: WeightedUpdate
    record: RunRecord
    evals: Evaluator
    versions: dict[int, torch.Tensor]
    snapshots: list[torch.Tensor]
    liveness: Liveness
    schedule: Schedule
    job: np.ndarray
    start: np.ndarray
    next_job: np.ndarray
    pending: Pending | None
    version: int
    step: int
    ghosts: int
    now: float

    @property
    def busy(self) -> np.ndarray:
        """The version each worker computes (``IDLE``: none)."""
        ...
