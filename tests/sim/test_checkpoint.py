"""Checkpoints: an interrupted run resumed from one gives the uninterrupted run's record,
byte for byte; checkpoint files hold no pickle and foreign ones are refused."""

from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest
import torch

from tailtrain.cli import main
from tailtrain.core import checkpoint
from tailtrain.errors import UsageError

RECORD = ("steps.jsonl", "evals.jsonl", "summary.json")


def interrupting(at: int):
    """A stand-in for the CLI's progress bar whose callback presses Ctrl-C after update
    ``at`` (counted over consecutive runs, as compare's bar counts them)."""

    @contextlib.contextmanager
    def step_progress(scenario, label, enabled, runs=1):
        done = [0]

        def for_run(index):
            def progress(step, now):
                done[0] += 1
                if done[0] == at:
                    raise KeyboardInterrupt

            return progress

        yield for_run

    return step_progress


# one strategy per topology: parameter server, allreduce, partial collective; and a run on a
# virtual-time budget (evaluation grid, LGC's deferred term and partial work)
CASES = {
    "ps-dbw": ["--strategy", "dbw:window=3", "--iterations", "14", "--eval-every", "3"],
    "allreduce-dropcompute": [
        "--strategy",
        "dropcompute:threshold=auto,calibrate=3",
        "--micro-batches",
        "3",
        "--iterations",
        "14",
        "--eval-every",
        "3",
    ],
    # shares that moved (persistent per-worker speeds) and the window behind them
    "allreduce-rebalance": [
        "--strategy",
        "rebalance:warmup=2",
        "--delay",
        "const:value=1",
        "--pattern",
        "heterogeneous:low=1,high=3",
        "--micro-batches",
        "3",
        "--iterations",
        "14",
        "--eval-every",
        "3",
    ],
    # the threshold's cut carried to the next step (``tasks.stream.CarryOver``)
    "allreduce-rebalance-carry": [
        "--strategy",
        "rebalance:warmup=2,then=dropcompute,calibrate=2,defer=true",
        "--pattern",
        "heterogeneous:low=1,high=3",
        "--micro-batches",
        "3",
        "--iterations",
        "14",
        "--eval-every",
        "3",
    ],
    # dealt on demand: the unit in flight at the N M-th completion carried to the next step
    "allreduce-rebalance-demand": [
        "--strategy",
        "rebalance:deal=demand",
        "--pattern",
        "heterogeneous:low=1,high=3",
        "--micro-batches",
        "3",
        "--iterations",
        "14",
        "--eval-every",
        "3",
    ],
    "partial-eager": ["--strategy", "eager:mode=majority", "--iterations", "14"],
    # replica groups (issue 38 item 4): the ranks' process is what a checkpoint keeps
    "allreduce-groups": [
        *("--workers", "6", "--group-size", "3", "--group-cost", "0.05"),
        *("--strategy", "dropcompute:threshold=auto,calibrate=3", "--micro-batches", "3"),
        *("--pattern", "persistent:h=3", "--iterations", "14", "--eval-every", "3"),
    ],
    "ps-groups": [
        *("--workers", "6", "--group-size", "2", "--strategy", "k-sync:k=2"),
        *("--iterations", "14", "--eval-every", "3"),
    ],
    "ps-lgc-time": [
        "--strategy",
        "lgc:k=3,blocks=4",
        "--pattern",
        "persistent:h=3",
        "--time-budget",
        "12",
        "--eval-interval",
        "1.5",
    ],
}


def simulate(argv, out, capsys, *extra):
    base = ["simulate", "--task", "logreg", "--workers", "5", "--delay", "exp:rate=1"]
    code = main([*base, *argv, "--seed", "3", "--out", str(out), "--no-progress", *extra])
    return code, capsys.readouterr()


@pytest.fixture
def small_blocks(monkeypatch):
    """Delays drawn 4 iterations at a time, so that a short run draws many blocks and a
    resume that lost the delay generators' state would show."""
    monkeypatch.setattr("tailtrain.delays.schedule.BLOCK", 4)
    monkeypatch.setattr("tailtrain.delays.schedule.ROUND_BLOCK", 4)


@pytest.mark.parametrize("case", sorted(CASES))
def test_resumed_run_is_byte_identical(case, tmp_path, capsys, monkeypatch, small_blocks):
    argv = CASES[case]
    progress_bar = __import__("tailtrain.cli.simulate").cli.simulate.step_progress
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert simulate(argv, whole, capsys)[0] == 0

    monkeypatch.setattr("tailtrain.cli.simulate.step_progress", interrupting(at=8))
    code, out = simulate(argv, cut, capsys, "--checkpoint-every", "3")
    assert code == 130
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and f"--resume {cut}" in lines[0], out.err
    assert json.loads((cut / "summary.json").read_text())["partial"] is True
    # the interrupted run streamed steps past its last checkpoint (update 6)
    assert len((cut / "steps.jsonl").read_text().splitlines()) == 8
    monkeypatch.setattr("tailtrain.cli.simulate.step_progress", progress_bar)

    assert main(["simulate", "--resume", str(cut), "--no-progress", "--json"]) == 0
    capsys.readouterr()
    for name in RECORD:
        assert (cut / name).read_bytes() == (whole / name).read_bytes(), name
    assert not (cut / checkpoint.FILENAME).exists()  # a finished run keeps none


# with a communication model: each topology's T^c stream (``delays.schedule.CommStream``)
COMM_CASES = {name: [*CASES[name], "--comm-time", "exp:rate=4"] for name in CASES}


def _as_before_comm_stream(state: dict) -> dict:
    """A checkpoint as written before the three T^c samplers became one ``CommStream``: the
    owners held the generator (and RoundClock its buffer), the timeline its own version
    array and its schedule tuples of ints, the driver an unread "nonfinite" count."""
    engine = state["engine"]
    for part in ("durations", "clock"):
        if part in engine:
            comm = engine[part].pop("comm")
            engine[part]["_comm_rng"] = comm["_rng"]
            if part == "clock":
                engine[part]["_comm"] = comm["_left"]
    if "timeline" in engine:
        schedule = engine["timeline"]["schedule"]["__fields__"]
        jobs = checkpoint.unpack(schedule["jobs"])
        engine["timeline"]["version"] = checkpoint.pack(jobs)
        for name in ("jobs", "asking"):
            schedule[name] = tuple(checkpoint.unpack(schedule[name]).tolist())
    return {**state, "nonfinite": 0}


@pytest.mark.parametrize("case", ["ps-dbw", "allreduce-dropcompute", "partial-eager"])
@pytest.mark.parametrize("legacy", [False, True])
def test_resume_keeps_the_comm_stream(case, legacy, tmp_path, capsys, monkeypatch, small_blocks):
    argv = COMM_CASES[case]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert simulate(argv, whole, capsys)[0] == 0
    monkeypatch.setattr("tailtrain.cli.simulate.step_progress", interrupting(at=8))
    assert simulate(argv, cut, capsys, "--checkpoint-every", "3")[0] == 130
    monkeypatch.undo()
    if legacy:
        path = cut / checkpoint.FILENAME
        state = checkpoint.load(path)
        state.pop("format")
        checkpoint.save(path, _as_before_comm_stream(state))
    assert main(["simulate", "--resume", str(cut), "--no-progress", "--json"]) == 0
    capsys.readouterr()
    for name in RECORD:
        assert (cut / name).read_bytes() == (whole / name).read_bytes(), name


def test_resume_takes_the_flags_from_the_run_folder(tmp_path, capsys, monkeypatch):
    cut = tmp_path / "cut"
    monkeypatch.setattr("tailtrain.cli.simulate.step_progress", interrupting(at=4))
    assert simulate(CASES["ps-dbw"], cut, capsys, "--checkpoint-every", "2")[0] == 130
    monkeypatch.undo()
    code = main(["simulate", "--resume", str(cut), "--workers", "7"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "drop --workers" in err and "\n" not in err
    code = main(["simulate", "--resume", str(cut), "--overwrite"])
    assert code == 2 and "--overwrite" in capsys.readouterr().err
    # a checkpoint of another run (here: another seed in run.json) is refused
    info = json.loads((cut / "run.json").read_text())
    (cut / "run.json").write_text(json.dumps({**info, "seed": 4}))
    assert main(["simulate", "--resume", str(cut)]) == 2
    assert "another run" in capsys.readouterr().err
    (cut / "run.json").write_text(json.dumps({**info, "extra": 1}))
    assert main(["simulate", "--resume", str(cut)]) == 2
    assert "run.json" in capsys.readouterr().err


def test_finished_run_has_nothing_to_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert simulate(["--iterations", "3"], out, capsys)[0] == 0
    assert main(["simulate", "--resume", str(out)]) == 2
    assert "finished" in capsys.readouterr().err


def test_pack_round_trips_generators_arrays_and_scalars():
    rng = np.random.default_rng(7)
    rng.random(3)
    value = {
        "rng": rng,
        "a": np.arange(6, dtype=np.int64).reshape(2, 3)[:, ::2],
        "b": np.array([True, False]),
        "empty": np.zeros((0, 4)),
        "t": (np.float64(0.1), None, [1, 2.5, "x"]),
        "k": {3: torch.ones(2)},
    }
    buffer = io.BytesIO()
    torch.save(checkpoint.pack(value), buffer)
    buffer.seek(0)
    fresh = np.random.default_rng(0)
    back = checkpoint.unpack(torch.load(buffer, weights_only=True), {"rng": fresh})
    assert back["rng"] is fresh and back["rng"].random() == rng.random()
    for key in ("a", "b", "empty"):
        assert back[key].dtype == value[key].dtype and np.array_equal(back[key], value[key])
    assert type(back["t"][0]) is np.float64 and back["t"][1:] == (None, [1, 2.5, "x"])
    assert torch.equal(back["k"][3], torch.ones(2))


class Payload:
    """Unpickling this would run a command: what weights_only=True exists to refuse."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_checkpoint_holding_a_pickled_object_is_refused(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"format": checkpoint.FORMAT, "engine": Payload()}, path)
    with pytest.raises(UsageError, match="not a readable tailtrain checkpoint"):
        checkpoint.load(path)
    path.write_bytes(b"garbage")
    with pytest.raises(UsageError, match="not a readable"):
        checkpoint.load(path)


def test_save_is_atomic_and_leaves_no_temporary(tmp_path):
    checkpoint.save(tmp_path / "c.pt", {"x": 1})
    checkpoint.save(tmp_path / "c.pt", {"x": 2})
    assert checkpoint.load(tmp_path / "c.pt")["x"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
