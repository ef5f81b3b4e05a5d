"""Who is slow in my Hugging Face Trainer job? A tiny GPT-2 under ``transformers.Trainer``
with tailtrain's probe callback.

Run (CPU, gloo, two processes; ``pip install 'tailtrain[hf]'``)::

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 examples/hf_probe.py --slow-rank 1
    tailtrain advise runs/hf-probe --for hf

The model is GPT-2 built from a config (one layer, 32 wide: no download), trained on a
character-level reading of a module of Python's standard library; the Trainer runs it in
Accelerate's DistributedDataParallel over gloo, two micro-batches per optimizer step. The
probe adds the one line marked ``# <- probe``; rank 0 writes ``runs/hf-probe/trace.csv`` and
``verdicts.jsonl``, logs the scores through the Trainer's ``log`` (its reporters, and
``trainer.state.log_history``, which this script saves to ``log_history.json``) and the
last line printed is the verdict. ``--slow-rank R`` makes every forward on rank R
``--slow-ms`` (default 40) milliseconds slower, as a slower GPU would be; ``--no-probe`` runs
the same job without the callback (the A/B of its cost in docs/hf.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import textwrap
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from tailtrain.hf import StragglerProbeCallback

BLOCK = 32  # characters per sample


class Characters(Dataset):
    """Blocks of ``BLOCK`` characters of ``text`` as token ids (one per distinct character),
    each its own labels (GPT-2 shifts them)."""

    def __init__(self, text: str) -> None:
        alphabet = sorted(set(text))
        self.vocab = len(alphabet)
        index = {c: i for i, c in enumerate(alphabet)}
        ids = torch.tensor([index[c] for c in text])
        self.blocks = ids[: len(ids) // BLOCK * BLOCK].view(-1, BLOCK)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-ms", type=float, default=40.0)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--out", default="runs/hf-probe")
    parser.add_argument("--no-probe", action="store_true", help="the same job without it")
    options = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = Characters(Path(textwrap.__file__).read_text())
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=BLOCK, vocab_size=data.vocab)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=str(Path(options.out) / "trainer"),
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        max_steps=options.steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=options.accumulate,
        learning_rate=1e-3,
        logging_steps=10,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    rank = args.process_index  # the group is up once the arguments chose the device
    if rank == options.slow_rank:
        delay = options.slow_ms / 1e3
        model.register_forward_pre_hook(lambda *_: time.sleep(delay))  # the injected straggler
    probe = StragglerProbeCallback(options.out, trainer=trainer)  # <- probe
    if not options.no_probe:
        trainer.add_callback(probe)  # <- probe
    trainer.train()

    if rank == 0:
        Path(options.out).mkdir(parents=True, exist_ok=True)
        history = Path(options.out) / "log_history.json"
        history.write_text(json.dumps(trainer.state.log_history, indent=1))
        runtime = trainer.state.log_history[-1]["train_runtime"]
        line = f"hf_probe: {trainer.state.global_step} optimizer steps on {args.world_size} ranks"
        if probe.probe is not None and probe.probe.last is not None:
            report = probe.probe.last
            line += ": " + ", ".join(f"rank {v.worker} {v.verdict}" for v in report.verdicts)
        print(f"train_runtime {runtime:.3f} s")
        print(line)
    dist.barrier()


if __name__ == "__main__":
    main()
