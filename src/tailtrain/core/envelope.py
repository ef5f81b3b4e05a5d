"""The state envelope: what a run goes on from, built here once (issue 35, item 1) for every
place that carries one: a checkpoint on disk (``simulate``'s driver, ``train``'s allreduce and
partial-collective ranks, its parameter server), a regroup's hand-over from the lead member
(``runtime.elastic.handover`` elects it and moves the envelope) and ``StragglerStep``'s
``state_dict``.

Every envelope holds the same fields (:data:`FIELDS`):

* ``step``: the rounds (steps) completed; ``now``: the run's clock after them, in seconds;
* ``rule``: the strategy's state (``Strategy.state_dict``); ``update``: the update path's
  (the deferred term of Live Gradient Compensation, non-finite screening), or None;
* ``evaluator``: the evaluator's position (:func:`evaluator_state`), or None;
* ``rows``: where the record stands (:func:`rows_at`): its row counts and the last rows a
  receiver may lack, or None where the record is the caller's (``StragglerStep``);
* ``pending``: the row of a round whose timings were still to come (None: none);
* ``deadline``: the learned hang deadline's recent rounds (``--on-rank-loss shrink``), or None;
* ``torch_rng``: torch's generator (None where the run draws from no torch generator).

A topology adds its own parts (its learner, delay draws, communication draws, ...) under
names of its own, which only it reads; a part may not take a field's name. A checkpoint file
holds the envelope and the run's identity (``core.checkpoint.FORMAT`` 2 on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from tailtrain.core import checkpoint
from tailtrain.core.evaluation import Evaluator

FIELDS = ("step", "now", "rule", "update", "evaluator", "rows", "pending", "deadline", "torch_rng")
#: what the scenario and seed rebuild in an evaluator (its data, schedule and model)
EVALUATOR_STATIC = ("schedule", "record", "enabled")


class Stateful(Protocol):
    """A part with PyTorch's checkpoint pair (a rule driver, an update path)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


def evaluator_state(evals: Evaluator) -> dict[str, Any]:
    """The evaluator's position: where its schedule stands and what it holds so far."""
    return checkpoint.capture(evals, EVALUATOR_STATIC)


def rows_at(
    steps: int,
    step_tail: Sequence[Mapping[str, Any]] = (),
    evals: int = 0,
    eval_tail: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Where the record stands: ``steps`` and ``evals`` rows so far, and the last of them the
    receiver may lack (a resumed rank 0 re-reads the rest from the run's folder; a hand-over
    sends the rows past the fewest any member holds; ``simulate`` carries all)."""
    if len(step_tail) > steps or len(eval_tail) > evals:
        raise ValueError("a record's tail cannot hold more rows than the record")
    return {
        "steps": int(steps),
        "evals": int(evals),
        "step_tail": checkpoint.pack([dict(row) for row in step_tail]),
        "eval_tail": checkpoint.pack([dict(row) for row in eval_tail]),
    }


def seal(
    *,
    step: int,
    now: float,
    rule: dict[str, Any],
    rows: dict[str, Any] | None,
    update: dict[str, Any] | None = None,
    evals: Evaluator | None = None,
    pending: Mapping[str, Any] | None = None,
    deadline: Sequence[float] | None = None,
    rng: bool = True,
    **parts: Any,
) -> dict[str, Any]:
    """The envelope of a run after ``step`` completed rounds (module docstring), with the
    topology's own ``parts``. ``rng``: whether torch's generator is part of the run."""
    clash = sorted(set(parts) & set(FIELDS))
    if clash:
        raise ValueError(f"a topology's part may not take an envelope field's name: {clash}")
    return {
        "step": int(step),
        "now": float(now),
        "rule": rule,
        "update": update,
        "evaluator": None if evals is None else evaluator_state(evals),
        "rows": rows,
        "pending": None if pending is None else checkpoint.pack(dict(pending)),
        "deadline": None if deadline is None else [float(s) for s in deadline],
        "torch_rng": torch.get_rng_state() if rng else None,
        **parts,
    }


def unseal(
    saved: Mapping[str, Any],
    *,
    rule: Stateful | None = None,
    update: Stateful | None = None,
    evals: Evaluator | None = None,
) -> None:
    """Put an envelope's common fields back into the live objects that receive them (the
    rule, the update path, the evaluator, torch's generator); the caller restores its parts,
    its step and clock, and its rows (:func:`step_tail`, :func:`eval_tail`, :func:`pending`)."""
    if rule is not None:
        rule.load_state_dict(saved["rule"])
    if update is not None:
        update.load_state_dict(saved["update"])
    if evals is not None:
        checkpoint.restore(evals, saved["evaluator"])
    if saved["torch_rng"] is not None:
        torch.set_rng_state(saved["torch_rng"])


def step_tail(saved: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The step rows the envelope carries (:func:`rows_at`), oldest first."""
    return list(checkpoint.unpack(saved["rows"]["step_tail"]))


def eval_tail(saved: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The evaluation rows the envelope carries, oldest first."""
    return list(checkpoint.unpack(saved["rows"]["eval_tail"]))


def pending(saved: Mapping[str, Any]) -> dict[str, Any] | None:
    """The row of the round whose timings were still to come, or None."""
    return None if saved["pending"] is None else checkpoint.unpack(saved["pending"])
