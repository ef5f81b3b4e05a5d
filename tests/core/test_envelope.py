"""The state envelope (``core.envelope``): one builder for checkpoints and hand-overs, whose
rows and generator survive a checkpoint file, and which no other module writes by hand."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.cli import main
from tailtrain.core import checkpoint, envelope

SRC = Path(__file__).resolve().parents[2] / "src" / "tailtrain"


class Held:
    """A part with PyTorch's checkpoint pair, remembering what it was given."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


def test_a_part_cannot_take_a_fields_name():
    with pytest.raises(ValueError, match="torch_rng"):
        envelope.seal(step=1, now=0.0, rule={}, rows=None, **{"rule2": 1, "torch_rng": 2})


def test_a_tail_longer_than_its_record_is_refused():
    with pytest.raises(ValueError, match="tail"):
        envelope.rows_at(1, [{"step": 0}, {"step": 1}])


rows = st.lists(
    st.fixed_dictionaries(
        {
            "step": st.integers(0, 10**6),
            "time": st.floats(allow_nan=False, allow_infinity=False),
            "loss": st.floats(allow_nan=False, allow_infinity=False).map(np.float64),
            "workers": st.lists(st.integers(0, 7), max_size=4),
        }
    ),
    max_size=5,
)


@settings(max_examples=25, deadline=None)
@given(steps=rows, evals=rows, extra=st.integers(0, 3))
def test_what_is_sealed_comes_back_from_a_checkpoint_file(tmp_path_factory, steps, evals, extra):
    rule, update = Held({"tau": 0.5, "seen": [1, 2]}), Held({"deferred": torch.arange(3.0)})
    torch.manual_seed(7)
    sealed = envelope.seal(
        step=len(steps) + extra,
        now=1.25,
        rule=rule.state_dict(),
        update=update.state_dict(),
        rows=envelope.rows_at(len(steps) + extra, steps, len(evals), evals),
        pending=steps[-1] if steps else None,
        deadline=[0.1, 0.2],
        theta=torch.ones(2),
    )
    draw = torch.rand(3)
    path = tmp_path_factory.mktemp("envelope") / checkpoint.FILENAME
    checkpoint.save(path, sealed)
    saved = checkpoint.load(path)
    assert set(envelope.FIELDS) <= set(saved)
    fresh_rule, fresh_update = Held({}), Held({})
    envelope.unseal(saved, rule=fresh_rule, update=fresh_update)
    assert torch.equal(torch.rand(3), draw)  # the generator as it was when sealed
    assert fresh_rule.state == rule.state
    assert torch.equal(fresh_update.state["deferred"], torch.arange(3.0))
    assert envelope.step_tail(saved) == steps and envelope.eval_tail(saved) == evals
    assert all(type(a["loss"]) is np.float64 for a in envelope.step_tail(saved))
    assert envelope.pending(saved) == (steps[-1] if steps else None)
    assert saved["rows"]["steps"] == len(steps) + extra and saved["deadline"] == [0.1, 0.2]


def test_a_run_that_draws_from_no_torch_generator_leaves_it_alone():
    sealed = envelope.seal(step=0, now=0.0, rule={}, rows=None, rng=False)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    envelope.unseal(sealed)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_simulate_checkpoint_is_an_envelope(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    args = ["simulate", "--strategy", "dropcompute:threshold=auto,calibrate=2"]
    args += ["--micro-batches", "2", "--iterations", "6", "--workers", "2"]
    args += ["--checkpoint-every", "2", "--out", str(out)]
    kept: list[dict] = []
    real = checkpoint.save

    def save(path, data):  # a completed run removes its checkpoint: keep what was written
        kept.append(data)
        real(path, data)

    monkeypatch.setattr(checkpoint, "save", save)
    assert main(args) == 0
    saved = kept[-1] if kept else None
    assert saved is not None and set(envelope.FIELDS) <= set(saved)
    assert saved["step"] == 6 and saved["rows"]["steps"] == 6
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert len(envelope.step_tail(saved)) == len(steps) == 6


def test_no_module_but_the_envelope_writes_its_fields_by_hand():
    """The envelope is built once: no other module names torch's generator state or an
    evaluator's capture in a dict it builds."""
    builders = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "core" / "envelope.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "get_rng_state":
                builders.append(f"{path.relative_to(SRC)}:{node.lineno}")
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if keys & {"evaluator", "pending"}:
                    builders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert builders == []
