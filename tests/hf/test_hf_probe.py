"""``tailtrain.hf.StragglerProbeCallback`` in a real ``transformers.Trainer`` run: two gloo
ranks on CPU under torchrun, a tiny GPT-2 built from a config, two micro-batches per optimizer
step, and a 40 ms sleep before every forward on rank 1 (the model computes in a few ms).
One job (``examples/hf_probe.py``, so the example is the drill) feeds every test here: the
callback names rank 1 as the DDP probe does on its drill (tests/integrate/test_probe.py),
rank 0 waits for it, the trace has a row per rank per optimizer step, the reports reach the
Trainer's log without costing it its own, and ``advise`` reads the folder."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.nn.parallel import DistributedDataParallel

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.cli.helpers import run
from tests.integrate.ranks import torchrun
from transformers import TrainerControl, TrainerState

from tailtrain.core.machine import read_machine
from tailtrain.delays.trace import read_trace
from tailtrain.hf import StragglerProbeCallback
from tailtrain.integrate.probe import SAMPLES, VERDICT_LEVELS, ProbeReport, watching
from tailtrain.persistence import classify_workers

ROOT = Path(__file__).resolve().parents[2]
STEPS, SLOW, ACCUMULATE, BATCH, LOG_EVERY = 40, 0.04, 2, 4, 10


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, str]:
    """The example's folder and its stdout, after one 2-process run."""
    out = tmp_path_factory.mktemp("hf") / "probe"
    args = ["--slow-rank", "1", "--slow-ms", str(1e3 * SLOW), "--steps", str(STEPS),
            "--accumulate", str(ACCUMULATE), "--out", str(out)]  # fmt: skip
    done = torchrun(ROOT / "examples" / "hf_probe.py", args, 2, fresh=out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, done.stdout


def micro_batches_per_step() -> list[int]:
    """The micro-batches of each optimizer step of the run: an epoch is each rank's share of
    the example's blocks in batches of ``BATCH``, cut into steps of ``ACCUMULATE``."""
    spec = importlib.util.spec_from_file_location("hf_probe", ROOT / "examples" / "hf_probe.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    blocks = len(example.Characters(Path(textwrap.__file__).read_text()))
    per_epoch = -(-blocks // (2 * BATCH))
    epoch = [ACCUMULATE] * (per_epoch // ACCUMULATE) + [per_epoch % ACCUMULATE] * bool(
        per_epoch % ACCUMULATE
    )
    return (epoch * STEPS)[:STEPS]


@pytest.mark.timeout(300)
def test_the_callback_names_the_slow_rank(job):
    out, stdout = job
    last = stdout.strip().splitlines()[-1]
    assert (
        last == f"hf_probe: {STEPS} optimizer steps on 2 ranks: rank 0 healthy, rank 1 persistent"
    )
    report = json.loads((out / "verdicts.jsonl").read_text().splitlines()[-1])
    assert report["step"] == STEPS
    assert [r["verdict"] for r in report["ranks"]] == ["healthy", "persistent"]
    # rank 0 waits in the allreduce for rank 1, not vice versa (the DDP watch found the model)
    assert report["sections"]["wait"][0] >= SLOW / 2
    assert report["sections"]["wait"][1] < SLOW / 2


@pytest.mark.timeout(300)
def test_the_trace_has_a_row_per_rank_per_optimizer_step(job):
    out, _ = job
    trace = read_trace(out / "trace.csv")
    assert trace.iteration.tolist() == [i for i in range(STEPS) for _ in (0, 1)]
    assert trace.worker.tolist() == [0, 1] * STEPS
    # every micro-batch's forward counted: the epoch's last step has what is left of it
    micro = micro_batches_per_step()
    assert trace.samples.tolist() == [BATCH * m for m in micro for _ in (0, 1)]
    assert min(micro) < ACCUMULATE  # the run holds such a step
    # the run's row tells advise that a step is ACCUMULATE loader batches (shares deal one)
    assert read_machine(out, 0)["accumulates"] == ACCUMULATE
    own = {w: trace.seconds[trace.worker == w] for w in (0, 1)}
    assert (own[1] >= SLOW * np.array(micro)).all()  # each step of rank 1 holds its sleeps
    # the verdicts the trace gives, after the probe's warm-up, are the callback's
    times = np.stack([own[0], own[1]], axis=1)[2:]
    assert [v.verdict for v in classify_workers(times)] == ["healthy", "persistent"]


@pytest.mark.timeout(300)
def test_the_reports_reach_the_trainers_log_and_keep_its_own(job):
    """The probe's numbers are in ``trainer.state.log_history`` (through ``Trainer.log``),
    and the Trainer's own loss log still comes every ``LOG_EVERY`` steps: the callback's log
    must not clear the Trainer's ``should_log`` (rank 0 alone skipping the loss's all-gather
    put the ranks' collectives out of step)."""
    out, _ = job
    history = json.loads((out / "log_history.json").read_text())
    probe = [entry for entry in history if "probe/wait_s/rank0" in entry]
    assert len(probe) >= 2
    assert probe[-1]["probe/verdict/rank1"] == VERDICT_LEVELS["persistent"]
    assert probe[-1]["probe/verdict/rank0"] == VERDICT_LEVELS["healthy"]
    assert probe[-1]["probe/score/rank1"] < probe[-1]["probe/score/rank0"]
    losses = [entry["step"] for entry in history if "loss" in entry]
    assert losses == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    final = next(i for i, entry in enumerate(history) if "train_runtime" in entry)
    assert history.index(probe[-1]) < final  # the last report, before the Trainer's last log


@pytest.mark.timeout(300)
def test_advise_reads_the_folder(job, capsys):
    out, _ = job
    code, stdout, err = run(["advise", str(out), "--for", "ddp", "--json"], capsys)
    assert code == 0, err
    payload = json.loads(stdout)
    assert payload["iterations"] == STEPS and payload["workers"] == 2
    assert [s["verdict"] for s in payload["stragglers"]] == ["healthy", "persistent"]
    assert payload["recommendation"] != "sync"


def report(verdicts: list[str]) -> ProbeReport:
    times = np.full((20, len(verdicts)), 0.01)
    times[:, [i for i, v in enumerate(verdicts) if v == "persistent"]] *= 3
    sections = {"data": [0.001, 0.002], "compute": [0.01, 0.03], "wait": [0.02, 0.0]}
    return ProbeReport(20, 1.0, classify_workers(times), sections)


def test_report_metrics_are_numbers_per_rank():
    logs = report(["healthy", "persistent"]).metrics()
    assert logs["probe/verdict/rank0"] == 0.0 and logs["probe/verdict/rank1"] == 2.0
    assert logs["probe/score/rank1"] < logs["probe/score/rank0"] == 1.0
    assert logs["probe/wait_s/rank0"] == 0.02 and logs["probe/compute_s/rank1"] == 0.03
    assert all(isinstance(value, float) for value in logs.values())  # what a reporter takes
    empty = ProbeReport(5, 1.0, [], {"data": [0.1], "compute": [0.2], "wait": [0]}).metrics()
    assert empty == {"probe/data_s/rank0": 0.1, "probe/compute_s/rank0": 0.2,
                     "probe/wait_s/rank0": 0.0}  # fmt: skip


class Trainer:
    """Stands in for ``transformers.Trainer``: its ``log`` clears ``should_log`` as the
    callback handler's ``on_log`` does."""

    def __init__(self, control: TrainerControl) -> None:
        self.control, self.logged = control, []

    def log(self, logs: dict[str, float]) -> None:
        self.logged.append(logs)
        self.control.should_log = False


def test_reports_are_logged_through_the_trainer_or_into_the_history():
    state, control = TrainerState(global_step=7), TrainerControl(should_log=True)
    trainer = Trainer(control)
    given = StragglerProbeCallback(None, trainer=trainer)
    given._reports.append(report(["healthy", "persistent"]))
    given._log_reports(state, control)
    assert trainer.logged == [report(["healthy", "persistent"]).metrics()]
    assert control.should_log and state.log_history == []  # the Trainer's own log still comes
    alone = StragglerProbeCallback(None)
    alone._reports.append(report(["healthy", "persistent"]))
    alone._log_reports(state, control)
    assert state.log_history == [{**report(["healthy", "persistent"]).metrics(), "step": 7}]
    assert not alone._reports


def test_a_misspelt_probe_option_fails_at_construction():
    with pytest.raises(TypeError, match="intervall"):
        StragglerProbeCallback("runs/probe", intervall=1.0)


def test_without_transformers_the_import_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers: ImportError
    for name in [m for m in sys.modules if m == "tailtrain.hf" or m.startswith("tailtrain.hf.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install 'tailtrain\[hf\]'"):
        importlib.import_module("tailtrain.hf")


@pytest.mark.timeout(60)
def test_the_callback_watches_the_ddp_module_that_holds_the_trainers_model(caplog):
    """Driven by hand on one gloo rank: the global pre-hook passes over a DDP module around
    another model, watches the one around the Trainer's and removes itself; a training
    forward's batch is the step's samples; and a first step that met no DDP module removes
    the hook with a warning."""
    args = SimpleNamespace(
        per_device_train_batch_size=3, gradient_accumulation_steps=1, device=torch.device("cpu")
    )
    state, control = TrainerState(), TrainerControl()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model, other = nn.Linear(4, 2), nn.Linear(4, 2)
        ddp, elsewhere = DistributedDataParallel(model), DistributedDataParallel(other)
        callback = StragglerProbeCallback(None, every=1, warmup=0)
        callback.on_train_begin(args, state, control, model=model)
        assert callback._finder is None  # one rank: no DDP to wait in
        callback._finder = register_module_forward_pre_hook(callback._finding(model))
        callback.on_step_begin(args, state, control)
        elsewhere(torch.ones(2, 4))
        assert watching(elsewhere) is None and callback._finder is not None
        ddp(torch.ones(5, 4)).sum().backward()
        assert watching(ddp) is callback.probe and callback._finder is None
        callback.on_step_end(args, state, control)
        assert callback.probe.history[-1, 0, SAMPLES] == 5
        callback._finder = register_module_forward_pre_hook(callback._finding(nn.Linear(1, 1)))
        callback.on_step_begin(args, state, control)
        ddp(torch.ones(2, 4)).sum().backward()
        callback.on_step_end(args, state, control)
        assert callback._finder is None and "no DistributedDataParallel" in caplog.text
        callback.on_train_end(args, state, control)
        assert callback.probe.steps == 2 and callback._counter is None
    finally:
        dist.destroy_process_group()
