"""``tailtrain.hf.RebalancedTrainer`` in a real ``transformers.Trainer`` run: two gloo ranks on
CPU under torchrun (tests/hf/rebalance_job.py), shares [6, 2] of a global batch of 2 x 4, two
micro-batches per optimizer step, two epochs of 7 global batches (so each epoch ends on a
step of one micro-batch), plain SGD. Each rank gets exactly its share of every global batch
that ``integrate.share_loader`` deals (Accelerate does not deal it again; the epoch reaches the
sampler), and both ranks end on the parameters of single-process SGD on the mean gradient
over each step's global batch, for a loss that is a mean over a rank's samples and for one
over ``num_items_in_batch`` counted across the ranks (the Trainer's default for a model that
takes it). The refusals and Accelerate's passthrough are checked in this process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from accelerate.data_loader import BatchSamplerShard, DataLoaderShard, skip_first_batches
from accelerate.utils import DistributedType
from tests.hf import rebalance_job as job
from tests.integrate.ranks import torchrun
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset
from transformers import TrainingArguments

from tailtrain.errors import UsageError
from tailtrain.hf import RebalancedTrainer
from tailtrain.hf.rebalance import passthrough, setup_refusal
from tailtrain.integrate.share_loader import ShareBatchSampler

ROOT = Path(__file__).resolve().parents[2]
#: float32 on the ranks against float64 here; a step with the ranks weighed 1/N is far outside
CLOSE = {"rtol": 1e-5, "atol": 1e-6}
STEPS_PER_EPOCH = 4  # 7 micro-batches in steps of 2, 2, 2, 1


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("hf_rebalance")
    script = ROOT / "tests" / "hf" / "rebalance_job.py"
    done = torchrun(script, [str(folder)], job.N, fresh=folder)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(job.N)]


def dealt_steps(rank: int) -> list[list[list[int]]]:
    """Rank ``rank``'s micro-batches of every epoch as ``ShareBatchSampler`` deals them from
    the Trainer's seed, in optimizer steps of ``ACCUMULATE`` (an epoch's last one shorter)."""
    sampler = DistributedSampler(
        range(job.SAMPLES), num_replicas=job.N, rank=rank, shuffle=True, seed=job.SEED
    )
    dealt = ShareBatchSampler(sampler, job.SHARES, job.B)
    steps, m = [], job.ACCUMULATE
    for epoch in range(job.EPOCHS):
        sampler.set_epoch(epoch)
        batches = list(dealt)
        steps += [batches[at : at + m] for at in range(0, len(batches), m)]
    return steps


def loss_of(w: torch.Tensor, idx: list[int], run: str) -> torch.Tensor:
    """The job's loss over the samples ``idx`` at parameters ``w`` (weight, then bias)."""
    x, labelled = job.X[idx].double(), job.LABELLED[idx]
    target = job.Y[idx].double().where(labelled, 0.0)
    errors = ((x @ w[: job.D] + w[job.D] - target) ** 2 * labelled).sum()
    return errors / (labelled.sum() if run == "item" else len(idx) * job.L)


def sgd(run: dict, name: str, weights: list[float] | None = None) -> tuple[torch.Tensor, list]:
    """Single-process SGD from the job's initial parameters over the steps the ranks saw:
    per step, the gradient of the loss over the step's global batch (every rank's samples of
    it), or with ``weights`` of sum_n weights[n] (the loss over rank n's samples). Returns
    the last parameters and each step's loss."""
    w, losses = torch.tensor(run[0]["initial"], dtype=torch.float64), []
    for at in range(len(run[0]["seen"])):
        mine = [[i for micro in rank["seen"][at] for i in micro] for rank in run]
        w.requires_grad_(True)
        if weights is None:
            loss = loss_of(w, [i for idx in mine for i in idx], name)
        else:
            loss = sum(c * loss_of(w, idx, name) for c, idx in zip(weights, mine, strict=True))
        (grad,) = torch.autograd.grad(loss, w)
        w = (w - job.LR * grad).detach()
        losses.append(float(loss.detach()))
    return w, losses


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(job.MODELS))
def test_each_rank_computes_its_share_of_every_global_batch(ranks, name):
    for r, rank in enumerate(ranks):
        run = rank[name]
        assert run["global_step"] == job.EPOCHS * STEPS_PER_EPOCH  # len() of the dealt loader
        assert run["seen"] == dealt_steps(r)  # in order; no re-shard, set_epoch reached
        assert {len(micro) for step in run["seen"] for micro in step} == {job.SHARES[r]}
    per_epoch = STEPS_PER_EPOCH
    for epoch in range(job.EPOCHS):
        steps = slice(epoch * per_epoch, (epoch + 1) * per_epoch)
        seen = [i for rank in ranks for s in rank[name]["seen"][steps] for m in s for i in m]
        assert len(seen) == len(set(seen)) == job.SAMPLES - job.SAMPLES % (job.N * job.B)
    assert ranks[0][name]["seen"][0] != ranks[0][name]["seen"][per_epoch]  # a new epoch's order


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(job.MODELS))
def test_the_update_is_the_global_batch_s_mean_gradient(ranks, name):
    run = [rank[name] for rank in ranks]
    assert run[0]["final"] == run[1]["final"]  # one allreduce's result on both ranks
    expected, losses = sgd(run, name)
    final = torch.tensor(run[0]["final"], dtype=torch.float64)
    torch.testing.assert_close(final, expected, **CLOSE)
    # the logged loss is the global batch's too, not the mean of the ranks' means
    for r in range(job.N):
        assert run[r]["logged"] == pytest.approx(losses, rel=1e-5)
        assert run[r]["training_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
        assert run[r]["screened"] == 0
    # DDP's own mean of the ranks' gradients (1/N each) is elsewhere: the hook weighed
    plain, _ = sgd(run, name, [1 / job.N] * job.N)
    assert not torch.allclose(final, plain, **CLOSE)


# ---- in this process: the refusals and Accelerate's passthrough ------------------------------
class Stream(IterableDataset):
    def __iter__(self):
        return iter(job.Rows()[i] for i in range(job.SAMPLES))


def trainer(tmp_path: Path, shares: list[int], data=None, **options) -> RebalancedTrainer:
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no",
        per_device_train_batch_size=job.B, disable_tqdm=True, **options,
    )  # fmt: skip
    data = job.Rows() if data is None else data
    return RebalancedTrainer(model=job.PerSample(), args=args, train_dataset=data, shares=shares)


@pytest.mark.parametrize(
    ("shares", "data", "options", "says"),
    [
        ([3], None, {}, r"shares=\[3\]: give one int >= 1 per rank \(1 ranks\) summing to "),
        ([2, 2], None, {}, r"shares=\[2, 2\]: give one int >= 1 per rank \(1 ranks\)"),
        ([4], Stream(), {"max_steps": 4}, "no indices to deal \\(an IterableDataset\\)"),
        ([4], None, {"train_sampling_strategy": "group_by_length"}, "batches by length"),
        ([4], None, {"auto_find_batch_size": True}, "auto_find_batch_size would change"),
    ],
)
def test_bad_input_is_refused_in_one_line(tmp_path, shares, data, options, says):
    with pytest.raises(UsageError, match=says) as refused:
        trainer(tmp_path, shares, data, **options)
    assert "\n" not in str(refused.value)


def test_a_run_that_is_not_plain_ddp_is_refused(tmp_path, monkeypatch):
    """One process deals plain batches of B; DeepSpeed, FSDP and DataParallel are refused."""
    one = trainer(tmp_path, [job.B])
    assert setup_refusal(one) is None
    assert [len(batch["idx"]) for batch in one.get_train_dataloader()] == [job.B] * (
        job.SAMPLES // job.B
    )
    for kind in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        faked = property(lambda _, k=kind: k)
        monkeypatch.setattr(type(one.accelerator), "distributed_type", faked)
        assert f"this run is {kind.value}" in setup_refusal(one)
    monkeypatch.undo()
    monkeypatch.setattr(one.args, "_n_gpu", 2)
    assert "drives 2 GPUs with DataParallel" in setup_refusal(one)


def test_accelerate_s_shard_wrapper_passes_the_dealt_batches_through():
    """``accelerator.prepare``'s ``BatchSamplerShard`` around the dealt batch sampler would
    give rank 1 every other batch and drop each not B long; passed through, the loader yields
    the deal, and a resumed epoch's ``skip_first_batches`` still reaches the sampler's epoch."""
    sampler = DistributedSampler(range(job.SAMPLES), num_replicas=job.N, rank=1, seed=job.SEED)
    dealt = ShareBatchSampler(sampler, job.SHARES, job.B)
    shard = BatchSamplerShard(dealt, num_processes=job.N, process_index=1)
    assert list(shard) != list(dealt)  # every other batch, a short one dropped, one padded
    loader = DataLoaderShard(job.Rows(), batch_sampler=shard)
    passthrough(loader, dealt)
    assert list(shard) == list(dealt) and len(loader) == len(dealt)
    resumed = skip_first_batches(loader, 2)
    resumed.set_epoch(3)
    assert sampler.epoch == 3
    assert [b["idx"].tolist() for b in resumed] == list(dealt)[2:]
    with pytest.raises(UsageError, match="not a BatchSamplerShard around it"):
        passthrough(DataLoader(range(8), batch_size=2), dealt)


def test_import_tailtrain_imports_no_transformers():
    code = "import sys, tailtrain; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
