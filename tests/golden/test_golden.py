"""Today's simulator reproduces the stored golden trajectories exactly (see trajectories.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "trajectories", Path(__file__).with_name("trajectories.py")
)
trajectories = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trajectories)


@pytest.mark.parametrize("name", sorted(trajectories.CASES))
def test_simulator_reproduces_the_golden_trajectory(name):
    stored = json.loads(trajectories.path_of(name).read_text())
    assert trajectories.record_of(name) == stored
