"""``tiny-gpt``: a deterministic corpus from the standard library, a transformer whose
gradients match a per-worker loop, and runs in simulate, train and ``StragglerStep``."""

from __future__ import annotations

import datetime
import json
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.cli.helpers import run
from tests.integrate.ranks import no_garbage_inherited

from tailtrain.tasks import parse_task
from tailtrain.tasks.corpus import IGNORE, PAD, decode_chars, encode_chars, stdlib_corpus
from tailtrain.tasks.gpt import CausalSelfAttention, make_tiny_gpt, next_char_losses

SMALL = "tiny-gpt:layers=1,width=32,heads=2,context=32,n=256,test=16,batch=2"


def test_the_corpus_is_deterministic_and_its_documents_vary_in_length():
    a, b = stdlib_corpus(64, n_train=500, n_test=50), stdlib_corpus(64, n_train=500, n_test=50)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    lengths = (a.y_train != IGNORE).sum(1).numpy()
    assert lengths.min() >= 15 and lengths.max() == 64 and np.std(lengths) > 5
    # targets are the inputs shifted by one character
    n = int(lengths[0])
    assert torch.equal(a.x_train[0, 1:n], a.y_train[0, : n - 1])
    assert decode_chars(encode_chars("def f(x):\n\treturn x")) == "def f(x):\n?return x"
    trimmed = a.trim(a.x_train[np.argsort(lengths)[:4]])
    assert trimmed.shape[-1] < 64 and (a.x_train[:, 0] != PAD).all()


def test_vmap_gradients_match_a_per_worker_loop():
    task = parse_task(SMALL, seed=0)
    assert task.gradient_method == "vmap"
    theta = task.init_params(0)
    idx = np.random.default_rng(1).integers(0, task.n_train, (4, 2))
    losses, grads = task.grads(theta, idx)
    loop_losses, loop_grads = task._batched(task._loop_grads, theta, idx)
    torch.testing.assert_close(grads, loop_grads, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(losses, loop_losses)
    assert float(losses.mean()) == pytest.approx(np.log(98), rel=0.05)  # uniform at N(0, .02)


def test_fused_attention_equals_the_masked_softmax():
    # without dropout the block calls scaled_dot_product_attention; with it, the masked form
    torch.manual_seed(0)
    attention = CausalSelfAttention(16, 2, 8, dropout=0.0)
    x = torch.randn(3, 2, 7, 16)
    torch.testing.assert_close(attention(x), _masked_attention(attention, x), rtol=1e-5, atol=1e-6)
    attention.dropout.p = 0.5
    attention.eval()  # evaluation: no dropout, the fused kernel again
    torch.testing.assert_close(attention(x), _masked_attention(attention, x), rtol=1e-5, atol=1e-6)


def _masked_attention(module: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    *batch, steps, width = x.shape
    q, k, v = module.qkv(x).split(width, -1)
    shape = (*batch, steps, module.heads, width // module.heads)
    q, k, v = (t.reshape(shape).transpose(-2, -3) for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2) / (width // module.heads) ** 0.5).masked_fill(
        ~module.mask[:steps, :steps], float("-inf")
    )
    out = scores.softmax(-1) @ v
    return module.proj(out.transpose(-2, -3).reshape(*batch, steps, width))


def test_dropout_is_seeded_by_the_workers_batches():
    task = parse_task(SMALL + ",dropout=0.2", seed=0)
    assert task.random
    theta = task.init_params(0)
    idx = np.random.default_rng(1).integers(0, task.n_train, (3, 2))
    first, again = task.grads(theta, idx)[1], task.grads(theta, idx)[1]
    assert torch.equal(first, again)
    other = task.grads(theta, idx[::-1].copy())[1]
    assert not torch.equal(first, other.flip(0))  # another draw for another worker order


@pytest.mark.timeout(120)
def test_tiny_gpt_simulates_and_trains(tmp_path, capfd):
    flags = ["--task", SMALL, "--iterations", "4", "--eval-every", "4", "--json"]
    code, out, err = run(
        ["simulate", *flags, "--workers", "16", "--strategy", "dbw", "--no-progress"], capfd
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["gradients"] == "vmap" and summary["eval_metric"] == "char_accuracy"
    code, out, err = run(["train", *flags, "--workers", "2", "--strategy", "sync"], capfd)
    assert code == 0, err
    assert json.loads(out)["iterations"] == 4


def straggler_rank(rank: int, port: int, folder: str) -> None:
    from tailtrain import StragglerStep

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    torch.manual_seed(0)
    parts = make_tiny_gpt(layers=1, width=32, heads=2, context=32, n=64, test=8)
    model, (x, y) = parts.model, parts.train
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    step = StragglerStep(model, optimizer, "sync")
    losses = []
    for s in range(3):
        rows = [torch.arange(4) + 8 * s + 4 * rank, torch.arange(4) + 32 + 8 * s + 4 * rank]
        record = step(
            [(x[r], y[r]) for r in rows], lambda b: next_char_losses(model(b[0]), b[1]).mean()
        )
        losses.append(record.loss)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    torch.save({"losses": losses, "theta": flat}, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.timeout(90)
def test_tiny_gpt_trains_through_straggler_step(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with no_garbage_inherited():
        mp.start_processes(straggler_rank, (port, str(tmp_path)), nprocs=2, start_method="fork")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert torch.equal(ranks[0]["theta"], ranks[1]["theta"])  # one model after allreduce
    assert all(np.isfinite(ranks[0]["losses"]))
