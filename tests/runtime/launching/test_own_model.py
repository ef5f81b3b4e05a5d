"""Your own model on the parameter server (``runtime.launching.own_model``,
``tailtrain.train_own_model``): the example runs end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_own_model_example_runs():
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "ps_own_model.py"), "--iterations", "5"],
        capture_output=True,
        text=True,
        timeout=110,
        env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "5 updates" in done.stdout
