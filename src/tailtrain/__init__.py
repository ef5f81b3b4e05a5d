"""tailtrain: keep data-parallel PyTorch training fast when some workers are slow.

Everything a user needs is one attribute of this package:

* define a run: a [`Scenario`][tailtrain.Scenario] and a strategy, as a spec string (`"dbw"`,
  `"k-sync:k=8"`) or a [`Strategy`][tailtrain.Strategy] object
  ([`strategy`][tailtrain.strategy] parses one);
* run it three ways on the same scenario: [`predict`][tailtrain.face.predict] (theory, in
  seconds), [`simulate`][tailtrain.simulate] (a virtual clock) and
  [`train`][tailtrain.train] (real processes); [`compare`][tailtrain.compare] strategies on
  the same delays;
* read a measured trace with [`advise`][tailtrain.face.advise];
* measure your own job: [`StragglerProbe`][tailtrain.StragglerProbe] (two lines in a DDP or
  any loop) names the slow ranks and writes the trace `advise` reads;
* simulate, compare and train your own model: a factory returning
  [`TaskParts`][tailtrain.TaskParts], named as `--task package.module:factory`;
* bring your own model or loop: [`train_own_model`][tailtrain.train_own_model] (a parameter
  server), [`StragglerStep`][tailtrain.StragglerStep] (your loop; with
  [`ShareSampler`][tailtrain.ShareSampler] for `rebalance`'s per-rank shares),
  [`ShardedStep`][tailtrain.ShardedStep] (your loop over an FSDP2 model on a replicate x
  shard mesh, the replica group as the worker), or
  [`StragglerHookState`][tailtrain.StragglerHookState] with
  [`weighted_allreduce_hook`][tailtrain.weighted_allreduce_hook] (a
  `DistributedDataParallel` comm hook; under `tailtrain launch --on-rank-loss shrink` it
  shrinks and heals, a restarted rank's default group set up by
  [`init_process_group`][tailtrain.init_process_group]); a rank the survivors of a shrink
  went on without raises [`Refused`][tailtrain.Refused] (under `ShardedStep`, every rank of
  a replica group that lost one);
* rebalance a DDP job with a persistent straggler: [`rebalance_loader`][tailtrain.rebalance_loader]
  deals each rank its share of the global batch, and
  [`sample_weighted_hook`][tailtrain.sample_weighted_hook] weighs each rank by its samples;
* what comes back is here too: [`RunRecord`][tailtrain.RunRecord] (`simulate`, `train` and
  `train_own_model`, on every rank alike), [`StepRecord`][tailtrain.StepRecord] (a
  `StragglerStep` step), [`ProbeReport`][tailtrain.ProbeReport] (a `StragglerProbe`), and
  [`RunControl`][tailtrain.RunControl], what `simulate(control=)` takes.

`import tailtrain` loads neither torch nor the simulator: each name is imported on first use.
No subpackage shares a face entry's name (the internals of `predict` and `advise` live in
`tailtrain.prediction` and `tailtrain.advice`), so an import never shadows an entry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tailtrain.errors import TailtrainError, UsageError

__version__ = "0.1.0"

# ---- the one table of import paths (update it, and the block below, when modules move) -------
# Names load on first use (PEP 562 __getattr__). The face's wrappers (tailtrain.face) reach
# the internals only through _INTERNAL, so this is the only file that names their modules.
#: public name -> (module, attribute)
_FACE: dict[str, tuple[str, str]] = {
    "Scenario": ("tailtrain.core.scenario", "Scenario"),
    "Strategy": ("tailtrain.strategies.base", "Strategy"),
    "strategy": ("tailtrain.face", "strategy"),
    "predict": ("tailtrain.face", "predict"),
    "simulate": ("tailtrain.face", "simulate"),
    "compare": ("tailtrain.face", "compare"),
    "train": ("tailtrain.face", "train"),
    "train_own_model": ("tailtrain.face", "train_own_model"),
    "advise": ("tailtrain.face", "advise"),
    "StragglerStep": ("tailtrain.integrate.step", "StragglerStep"),
    "ShardedStep": ("tailtrain.integrate.sharded", "ShardedStep"),
    "Refused": ("tailtrain.runtime.elastic.shrink", "Refused"),
    "ShareSampler": ("tailtrain.integrate.sampler", "ShareSampler"),
    "StragglerHookState": ("tailtrain.integrate.ddp", "StragglerHookState"),
    "init_process_group": ("tailtrain.integrate.default_group", "init_process_group"),
    "StragglerProbe": ("tailtrain.integrate.probe", "StragglerProbe"),
    "weighted_allreduce_hook": ("tailtrain.integrate.ddp", "weighted_allreduce_hook"),
    "rebalance_loader": ("tailtrain.integrate.share_loader", "rebalance_loader"),
    "sample_weighted_hook": ("tailtrain.integrate.share_loader", "sample_weighted_hook"),
    "RunRecord": ("tailtrain.core.records", "RunRecord"),
    "RunControl": ("tailtrain.core.session", "RunControl"),
    "StepRecord": ("tailtrain.integrate.rounds", "StepRecord"),
    "ProbeReport": ("tailtrain.integrate.probe", "ProbeReport"),
    "Prediction": ("tailtrain.prediction.scenario", "Prediction"),
    "Comparison": ("tailtrain.sim.compare", "Comparison"),
    "Advice": ("tailtrain.advice", "Advice"),
    "TaskParts": ("tailtrain.tasks.factory", "TaskParts"),
}
#: what the face's wrappers call -> (module, attribute); see ``tailtrain.face``
_INTERNAL: dict[str, tuple[str, str]] = {
    "parse_strategy": ("tailtrain.strategies.registry", "parse_strategy"),
    "parse_strategies": ("tailtrain.strategies.registry", "parse_strategies"),
    "simulate": ("tailtrain.sim.run", "simulate"),
    "compare": ("tailtrain.sim.compare", "compare"),
    "predict": ("tailtrain.prediction", "predict"),
    "with_families": ("tailtrain.prediction.families", "with_families"),
    "DelayScenario": ("tailtrain.prediction.scenario", "DelayScenario"),
    "K_FAMILY": ("tailtrain.prediction.scenario", "K_FAMILY"),
    "parse_delay": ("tailtrain.delays", "parse_delay"),
    "parse_pattern": ("tailtrain.delays", "parse_pattern"),
    "parse_comm_time": ("tailtrain.delays.comm", "parse_comm_time"),
    "TrainConfig": ("tailtrain.runtime.config", "TrainConfig"),
    "train": ("tailtrain.runtime.launching.launch", "train"),
    "train_own_model": ("tailtrain.runtime.launching.own_model", "train_own_model"),
    "in_torchrun": ("tailtrain.runtime.launching.checks", "in_torchrun"),
    "prepare_folder": ("tailtrain.core.records", "prepare_folder"),
    "held_run": ("tailtrain.core.records", "held_run"),
    "clear_run": ("tailtrain.core.records", "clear_run"),
    "RUN_FILES": ("tailtrain.core.records", "RUN_FILES"),
    "TRAIN_EXTRA": ("tailtrain.core.records", "TRAIN_EXTRA"),
    "advise": ("tailtrain.advice", "advise"),
}

if TYPE_CHECKING:  # the same paths as _FACE, for type checkers (tests/test_face.py compares)
    from tailtrain.advice import Advice
    from tailtrain.core.records import RunRecord
    from tailtrain.core.scenario import Scenario
    from tailtrain.core.session import RunControl
    from tailtrain.face import (
        advise,
        compare,
        predict,
        simulate,
        strategy,
        train,
        train_own_model,
    )
    from tailtrain.integrate.ddp import StragglerHookState, weighted_allreduce_hook
    from tailtrain.integrate.default_group import init_process_group
    from tailtrain.integrate.probe import ProbeReport, StragglerProbe
    from tailtrain.integrate.rounds import StepRecord
    from tailtrain.integrate.sampler import ShareSampler
    from tailtrain.integrate.sharded import ShardedStep
    from tailtrain.integrate.share_loader import rebalance_loader, sample_weighted_hook
    from tailtrain.integrate.step import StragglerStep
    from tailtrain.prediction.scenario import Prediction
    from tailtrain.runtime.elastic.shrink import Refused
    from tailtrain.sim.compare import Comparison
    from tailtrain.strategies.base import Strategy
    from tailtrain.tasks.factory import TaskParts
# ------------------------------------------------------------------------------------------------

__all__ = [
    "Advice",
    "Comparison",
    "Prediction",
    "ProbeReport",
    "Refused",
    "RunControl",
    "RunRecord",
    "Scenario",
    "ShardedStep",
    "ShareSampler",
    "StepRecord",
    "StragglerHookState",
    "StragglerProbe",
    "StragglerStep",
    "Strategy",
    "TailtrainError",
    "TaskParts",
    "UsageError",
    "__version__",
    "advise",
    "compare",
    "init_process_group",
    "predict",
    "rebalance_loader",
    "sample_weighted_hook",
    "simulate",
    "strategy",
    "train",
    "train_own_model",
    "weighted_allreduce_hook",
]


def _resolve(path: tuple[str, str]) -> Any:
    """The object at ``(module, attribute)``, importing the module."""
    module, attribute = path
    return getattr(importlib.import_module(module), attribute)


def _internal(name: str) -> Any:
    """An internal function or class the face's wrappers call (``_INTERNAL``)."""
    return _resolve(_INTERNAL[name])


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module 'tailtrain' has no attribute {name!r}")
    value = _resolve(_FACE[name])
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
