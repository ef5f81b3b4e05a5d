"""Today's simulator reproduces the stored golden trajectories (see trajectories.py): every
decision, count and virtual time exactly, and the model's float32 losses and scores to within
a few units in the last place, which is as far as torch's CPU kernels agree between
instruction sets (AVX-512 and AVX2 machines differ there by ~1e-7 relative)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

_spec = importlib.util.spec_from_file_location(
    "trajectories", Path(__file__).with_name("trajectories.py")
)
trajectories = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trajectories)

#: row keys holding what the float32 model computed; the rest must match exactly
MODEL_VALUES = frozenset({"loss", "train_loss", "eval", "eval_loss"})
#: float32 has a 6e-8 unit roundoff; a few of them
MODEL_RTOL = 1e-6


def mismatches(stored: Any, today: Any, path: str = "", model: bool = False) -> list[str]:
    """Where ``today`` differs from ``stored`` beyond what the rule above allows."""
    if isinstance(stored, dict) and isinstance(today, dict):
        if stored.keys() != today.keys():
            return [f"{path}: keys {sorted(stored)} != {sorted(today)}"]
        return [
            m
            for key in stored
            for m in mismatches(stored[key], today[key], f"{path}.{key}", key in MODEL_VALUES)
        ]
    if isinstance(stored, list) and isinstance(today, list):
        if len(stored) != len(today):
            return [f"{path}: {len(stored)} items != {len(today)}"]
        return [
            m
            for i, (a, b) in enumerate(zip(stored, today, strict=True))
            for m in mismatches(a, b, f"{path}[{i}]", model)
        ]
    close = (
        model
        and isinstance(stored, float)
        and isinstance(today, float)
        and math.isclose(stored, today, rel_tol=MODEL_RTOL)  # inf is close to itself
    )
    if stored == today or close or (stored != stored and today != today):  # NaN == NaN here
        return []
    return [f"{path}: {stored!r} != {today!r}"]


@pytest.mark.parametrize("name", sorted(trajectories.CASES))
def test_simulator_reproduces_the_golden_trajectory(name):
    stored = json.loads(trajectories.path_of(name).read_text())
    assert mismatches(stored, trajectories.record_of(name)) == []


def test_the_comparison_allows_roundoff_in_losses_only():
    row = {"step": 1, "time": 0.5, "loss": 2.3144004344940186, "workers": [0, 2]}
    assert mismatches(row, {**row, "loss": 2.3144001960754395}) == []
    assert mismatches(row, {**row, "loss": 2.32}) != []
    assert mismatches(row, {**row, "time": 0.5 + 1e-12}) != []
    assert mismatches(row, {**row, "workers": [0, 1]}) != []
    assert mismatches(row, {**row, "extra": 1}) != []
    assert mismatches({"loss": math.nan}, {"loss": math.nan}) == []
