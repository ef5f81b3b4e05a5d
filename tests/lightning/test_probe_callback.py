"""The probe callback with the real Lightning: on two gloo ranks under ``torch.distributed.run``
(``probe_drill.py``: rank 1 sleeps 40 ms in every ``training_step``, one job of three runs read
by several tests) it names rank 1 as the DDP probe does on the same drill, its trace shows the
wait and ``advise`` reads it; on one process (no DDP) it still times steps, and its data time is
the loader's; an exception leaves no thread and gathers nothing; it pickles for ``ddp_spawn``."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lightning")

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from tailtrain.advice import advise
from tailtrain.core.machine import read_machine
from tailtrain.delays.trace import read_trace
from tailtrain.lightning import StragglerProbeCallback

ROOT = Path(__file__).resolve().parents[2]
DRILL = Path(__file__).with_name("probe_drill.py")
#: probe_drill.py's: steps of the ``ddp`` run, optimizer steps of the ``accumulate`` run (two
#: batches each), batch size, rank 1's sleep per training step
STEPS, ACCUMULATED, BATCH, SLOW = 24, 8, 8, 0.04


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def drill(tmp_path_factory) -> tuple[Path, list[dict]]:
    """probe_drill.py on two ranks: its folder and what each rank wrote."""
    folder = tmp_path_factory.mktemp("lightning_probe")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(DRILL), str(folder),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow  # the drill: two processes importing Lightning, ~40 s on CI
@pytest.mark.timeout(180)
def test_the_callback_names_the_slow_rank_as_the_ddp_probe_does(drill):
    """tests/integrate/test_probe.py's assertions on the callback's trace and last report,
    and the verdicts the plain DDP probe gives on the same drill in the same processes."""
    folder, ranks = drill
    trace = read_trace(folder / "ddp" / "trace.csv")
    assert trace.iteration.max() == STEPS - 1 and set(trace.worker.tolist()) == {0, 1}
    own = {w: trace.seconds[trace.worker == w] for w in (0, 1)}
    assert (own[1] >= SLOW).all()  # every one of rank 1's steps holds its sleep
    assert np.median(own[1] - own[0]) >= SLOW / 2
    report = ranks[0]["ddp"]["report"]
    assert report["step"] == STEPS
    assert report["sections"]["wait"][0] >= SLOW / 2  # rank 0 waits for rank 1, not vice versa
    verdicts = [r["verdict"] for r in report["ranks"]]
    assert verdicts == ["healthy", "persistent"]
    assert verdicts == [r["verdict"] for r in ranks[0]["plain"]["report"]["ranks"]]
    assert ranks[1]["ddp"]["report"] is None and ranks[1]["ddp"]["metrics"] == {}  # rank 0's
    assert ranks[0]["ddp"]["global_step"] == STEPS
    assert [out[run]["hooked"] for out in ranks for run in ("ddp", "accumulate")] == [0] * 4


@pytest.mark.slow  # the drill: two processes importing Lightning, ~40 s on CI
@pytest.mark.timeout(180)
def test_the_fast_rank_waits_the_skew_in_ddps_allreduce(drill):
    """The trace's noncompute on rank 0 is its wait in DDP's reduction, about the skew the two
    ranks' own times show (both read off the same steps, so a loaded machine moves both);
    rank 1 hardly waits."""
    folder, _ = drill
    trace = read_trace(folder / "ddp" / "trace.csv")
    rank = {w: trace.worker == w for w in (0, 1)}
    skew = np.median(trace.seconds[rank[1]] - trace.seconds[rank[0]])
    wait = {w: np.median(trace.noncompute[rank[w]]) for w in (0, 1)}
    assert wait[0] >= SLOW / 2 and abs(wait[0] - skew) <= SLOW / 2
    assert wait[1] < SLOW / 2


@pytest.mark.slow  # the drill: two processes importing Lightning, ~40 s on CI
@pytest.mark.timeout(180)
def test_advise_on_the_callbacks_folder_recommends_a_remedy(drill):
    folder, _ = drill
    found = advise(folder / "ddp", setup="ddp").to_json()
    verdicts = {s["worker"]: s["verdict"] for s in found["stragglers"]}
    assert verdicts == {0: "healthy", 1: "persistent"}
    assert found["recommendation"] != "sync", found["reason"]


@pytest.mark.slow  # the drill: two processes importing Lightning, ~40 s on CI
@pytest.mark.timeout(180)
def test_the_scores_reach_the_trainers_logger_and_callback_metrics(drill):
    """The CSV logger's metrics file (rank 0 writes it) holds each report's sections and, from
    the first verdict on, the scores and verdicts (2: persistent) at the report's step;
    ``trainer.callback_metrics`` holds the last report's."""
    folder, ranks = drill
    import pandas as pd

    metrics = pd.read_csv(folder / "csv_ddp" / "version_0" / "metrics.csv")
    scored = metrics.dropna(subset=["probe/score/rank1"])
    assert scored["step"].tolist() == [16, STEPS]  # a report every 8 steps, verdicts from 10
    last = scored.iloc[-1]
    assert last["probe/verdict/rank1"] == 2 and last["probe/verdict/rank0"] == 0
    assert last["probe/score/rank1"] < 0.5 < last["probe/score/rank0"]
    assert last["probe/wait_s/rank0"] >= SLOW / 2
    report = ranks[0]["ddp"]["report"]
    callback = ranks[0]["ddp"]["metrics"]
    assert callback["probe/verdict/rank1"] == 2
    assert callback["probe/score/rank1"] == pytest.approx(report["ranks"][1]["score"])
    assert last["probe/score/rank1"] == pytest.approx(report["ranks"][1]["score"])


@pytest.mark.slow  # the drill: two processes importing Lightning, ~40 s on CI
@pytest.mark.timeout(180)
def test_an_accumulated_step_is_one_row_per_rank(drill):
    """``accumulate_grad_batches=2``: one trace row per optimizer step and rank, its samples
    both batches', and rank 0 waits twice a step: at Lightning's SIGTERM broadcast before the
    second batch, and in the step's one reduction. Both are its wait, not its compute (the
    broadcast's counted as compute: 46 ms of rank 0's compute was 40 ms of wait, and a
    newcomer's job with k = 4 read its 15x slower rank as 1.29x)."""
    folder, ranks = drill
    trace = read_trace(folder / "accumulate" / "trace.csv")
    assert sorted(zip(trace.iteration.tolist(), trace.worker.tolist(), strict=True)) == [
        (i, w) for i in range(ACCUMULATED) for w in (0, 1)
    ]
    assert (trace.samples == 2 * BATCH).all()
    assert np.median(trace.noncompute[trace.worker == 0]) >= 1.5 * SLOW
    assert np.median(trace.seconds[trace.worker == 0]) < SLOW / 2
    assert np.median(trace.seconds[trace.worker == 1]) >= 2 * SLOW
    assert ranks[0]["accumulate"]["global_step"] == ACCUMULATED
    # the run's row tells advise that a step is 2 loader batches (shares deal one)
    assert read_machine(folder / "accumulate", 0)["accumulates"] == 2
    assert "accumulates" not in read_machine(folder / "ddp", 0)


class Regression(LightningModule):
    """A linear regression; ``fail_at``: the training step that raises."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.net, self.fail_at = nn.Linear(6, 2), fail_at

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.fail_at:
            raise KeyError("the step failed")
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SlowData(Dataset):
    """``size`` random pairs, each taking ``delay`` seconds to load."""

    def __init__(self, size: int, delay: float) -> None:
        self.x = torch.randn(size, 6, generator=torch.Generator().manual_seed(0))
        self.y = torch.randn(size, 2, generator=torch.Generator().manual_seed(1))
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def trainer(folder: Path, callback: StragglerProbeCallback, **options) -> Trainer:
    return Trainer(
        accelerator="cpu", devices=1, logger=CSVLogger(folder, name="csv", version=0),
        callbacks=[callback], enable_progress_bar=False, enable_checkpointing=False,
        enable_model_summary=False, log_every_n_steps=1, **options,
    )  # fmt: skip


@pytest.mark.timeout(120)
def test_one_process_times_its_steps_and_its_loaders_time_is_the_data(tmp_path):
    """No DDP: the callback times each optimizer step (no wait, no verdict on one rank) and
    its data time is the loader's (5 ms a sample, 8 samples a batch, the model's compute well
    under a millisecond); the loggers get the sections; the callback pickles before and
    after (``ddp_spawn`` pickles it to the processes it starts)."""
    callback = StragglerProbeCallback(tmp_path / "probe", every=3)
    assert pickle.loads(pickle.dumps(callback)).options == callback.options
    steps = 6
    loader = DataLoader(SlowData(steps * BATCH, 0.005), batch_size=BATCH)
    trainer(tmp_path, callback, max_steps=steps).fit(Regression(), loader)
    trace = read_trace(tmp_path / "probe" / "trace.csv")
    assert trace.iteration.tolist() == list(range(steps)) and set(trace.worker) == {0}
    # no wait: the noncompute is Lightning's own time between steps, outside the loader's
    assert (trace.noncompute < 0.01).all() and (trace.samples == BATCH).all()
    report = callback.report
    assert report is not None and report.step == steps and report.verdicts == []
    data, compute = report.sections["data"][0], report.sections["compute"][0]
    assert data >= 0.6 * BATCH * 0.005 and data > compute  # the loader's, not the model's
    assert trace.seconds.min() >= 0.6 * BATCH * 0.005  # seconds = data + compute
    assert callback.probe is None  # closed at the end of training
    assert float(trainer_metrics(tmp_path)["probe/data_s/rank0"].dropna().iloc[-1]) == data
    again = pickle.loads(pickle.dumps(callback))
    assert again.report == report and again.probe is None


@pytest.mark.timeout(120)
def test_a_resumed_fit_logs_at_the_trainers_steps_and_appends_a_run(tmp_path):
    """A fit resumed from a checkpoint at step 4: its reports reach the logger at the
    trainer's global steps (4 + the probe's), and its rows enter the folder's trace as run 1."""
    data = DataLoader(TensorDataset(torch.randn(80, 6), torch.randn(80, 2)), batch_size=8)
    probe = StragglerProbeCallback(tmp_path / "probe", every=2, warmup=0)
    first = trainer(tmp_path / "first", probe, max_steps=4)
    first.fit(Regression(), data)
    first.save_checkpoint(tmp_path / "step4.ckpt")
    callback = StragglerProbeCallback(tmp_path / "probe", every=2, warmup=0)
    again = trainer(tmp_path, callback, max_steps=8)
    again.fit(Regression(), data, ckpt_path=tmp_path / "step4.ckpt")
    logged = trainer_metrics(tmp_path).dropna(subset=["probe/data_s/rank0"])
    assert logged["step"].tolist() == [6, 8] and callback.report.step == 4
    trace = read_trace(tmp_path / "probe" / "trace.csv")
    assert trace.runs == [0, 1] and len(trace.iteration) == 8


def trainer_metrics(folder: Path):
    import pandas as pd

    return pd.read_csv(folder / "csv" / "version_0" / "metrics.csv")


@pytest.mark.timeout(120)
def test_an_exception_in_training_gathers_nothing_and_leaves_no_thread(tmp_path):
    """A training step that raises at batch 7: the exception comes out of ``fit``, the probe
    ends its reporting thread without a gather (its open step is left unreported), and the
    windows reported before are in the trace."""
    callback = StragglerProbeCallback(tmp_path / "probe", every=3)
    seen = []
    module = Regression(fail_at=7)
    on_start = callback.on_train_batch_start

    def noting(trainer, pl_module, batch, batch_idx) -> None:
        on_start(trainer, pl_module, batch, batch_idx)
        seen.append(callback.probe)

    callback.on_train_batch_start = noting
    data = TensorDataset(torch.randn(80, 6), torch.randn(80, 2))
    with pytest.raises(KeyError, match="the step failed"):
        trainer(tmp_path, callback, max_steps=10).fit(module, DataLoader(data, batch_size=8))
    probe = seen[-1]
    assert probe is not None and callback.probe is None
    assert probe.reporter is None and probe.current is not None  # step 7 never closed
    assert probe.steps == 7
    trace = read_trace(tmp_path / "probe" / "trace.csv")
    assert trace.iteration.max() == 5  # the window gathered at step 6, taken at step 7's close


def test_a_bad_cadence_is_refused_before_training():
    with pytest.raises(ValueError, match="interval > 0"):
        StragglerProbeCallback(None, every=0)
