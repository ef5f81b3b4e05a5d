"""A DDP job with the comm hook, shaped on PyTorch's tutorial (``ddp_tutorial.py``: its
``DistributedSampler(dataset)`` unchanged, three lines added), across two loopback nodes of two
ranks under ``tailtrain launch --nnodes 2 --store apart --on-rank-loss shrink --restart-lost
1``: rank 2 is SIGKILLed inside step 5, its node leaves whole and is started again, the live
node goes on alone and takes it back at a step boundary from a live peer. Every rank ends with
the same parameters, which equal a reference rebuilt from the records (which ranks, with which
weights and micro-batches, entered each step, each drawing its sampler's shard)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.integrate.test_shrink_step import matches_reference
from tests.runtime.launching.test_nodes import environment, free_port
from torch.utils.data.distributed import DistributedSampler

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "integrate" / "ddp_tutorial.py"
#: ranks, the killed one and the step it dies in; steps after the heal; batch size
WORLD, VICTIM, AT, AFTER, BATCH = 4, 2, 5, 6, 32


def tutorial():
    spec = importlib.util.spec_from_file_location("ddp_tutorial", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_job(
    out: Path, epochs: int = 100, pace: float | None = None
) -> tuple[list[subprocess.CompletedProcess], subprocess.CompletedProcess]:
    """The store apart and both nodes' launchers, each in a session of its own (as on its own
    machine); their outcomes once all ended (bounded)."""
    port, env = free_port("127.0.0.2"), environment()
    endpoint = f"127.0.0.2:{port}"
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    store = subprocess.Popen(
        [sys.executable, "-m", "tailtrain", "store", "--nnodes", "2", "--rdzv-endpoint", endpoint,
         "--timeout", "30"], env=env, **pipes,
    )  # fmt: skip
    time.sleep(0.5)
    nodes = []
    for i in range(2):  # a session each: a node's launcher and ranks go as one
        command = [
            sys.executable, "-m", "tailtrain", "launch", "--nnodes", "2", "--node-rank", str(i),
            "--nproc-per-node", "2", "--store", "apart", "--rdzv-endpoint", endpoint,
            "--on-rank-loss", "shrink", "--restart-lost", "1", "--timeout", "120", str(SCRIPT),
            str(epochs), "--kill-rank", str(VICTIM), "--kill-step", str(AT), "--after-heal",
            str(AFTER), "--out", str(out),
        ]  # fmt: skip
        command += [] if pace is None else ["--pace", str(pace)]
        nodes.append(subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, **pipes))
    done = []
    for p in nodes:
        stdout, stderr = p.communicate(timeout=400)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    _, stderr = store.communicate(timeout=60)
    return done, subprocess.CompletedProcess(store.args, store.returncode, "", stderr)


def rebuilt(records: list[dict]) -> dict[str, torch.Tensor]:
    """A reference: SGD with momentum on sum_n w_n G_n over the ranks each record names, G_n
    rank n's mean gradient over the micro-batches it counted of its sampler's batch."""
    m = tutorial()
    dataset, model, optimizer = m.load_train_objs(0)
    per_epoch = math.ceil(len(DistributedSampler(dataset, WORLD, 0)) / BATCH)
    for record in records:
        epoch, b = divmod(record["step"], per_epoch)
        total = [torch.zeros_like(p) for p in model.parameters()]
        for n in record["ranks"]:
            sampler = DistributedSampler(dataset, WORLD, record["live"][n], seed=0)
            sampler.set_epoch(epoch)
            x, y = dataset[list(sampler)[b * BATCH : (b + 1) * BATCH]]
            counted = list(zip(x.chunk(m.M), y.chunk(m.M), strict=True))[: record["completed"][n]]
            model.zero_grad()
            for bx, by in counted:
                F.cross_entropy(model(bx), by).backward()
            for t, p in zip(total, model.parameters(), strict=True):
                t.add_(p.grad, alpha=record["weights"][n] / len(counted))
        if not record["empty"]:
            for p, t in zip(model.parameters(), total, strict=True):
                p.grad = t
            optimizer.step()
    return model.state_dict()


@pytest.mark.slow  # a store, two launchers, four ranks and two restarted, each importing torch
@pytest.mark.timeout(480)
def test_a_ddp_job_with_the_hook_loses_a_node_and_heals_it_from_a_live_peer(tmp_path):
    done, store = run_job(tmp_path)
    for d in done:
        assert d.returncode == 0, d.stderr[-3000:]
    assert store.returncode == 0, store.stderr[-2000:]
    assert "its node's ranks [2, 3] were started again (1 of 1)" in done[1].stderr
    kept = {r: torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)}
    records = kept[0]["records"]
    assert kept[1]["records"] == records
    lost = [(r["step"], r["lost"], r["redone"]) for r in records if r["lost"]]
    assert lost == [(AT, [2, 3], True)]
    healed = [(r["step"], r["rejoined"]) for r in records if r["rejoined"]]
    assert len(healed) == 1 and healed[0][1] == [2, 3]  # the node whole, at one boundary
    at = healed[0][0]
    for r in (2, 3):  # from the heal on, the same records as the live node's
        assert kept[r]["records"] == records[at:]
    assert [r["live"] for r in records] == (
        [[0, 1, 2, 3]] * AT + [[0, 1]] * (at - AT) + [[0, 1, 2, 3]] * (AFTER + 1)
    )
    models = [kept[r]["model"] for r in range(WORLD)]
    for name, value in models[0].items():
        assert all(torch.equal(value, other[name]) for other in models[1:]), name
    matches_reference(models[0], rebuilt, records)


@pytest.mark.slow  # a store, two launchers, four ranks and two restarted, each importing torch
@pytest.mark.timeout(480)
def test_a_heal_that_fails_fails_its_node_s_launcher_in_one_line(tmp_path):
    """The live node finishes its two epochs (unpaced) before node 1's restarted ranks ask to
    join: they are refused, and node 1's launcher exits non-zero with one line, while the live
    node, whose parameters stay equal, exits 0."""
    done, _ = run_job(tmp_path, epochs=2, pace=0.0)
    assert done[0].returncode == 0, done[0].stderr[-3000:]
    assert done[1].returncode != 0, done[1].stderr[-3000:]
    last = done[1].stderr.strip().splitlines()[-1]
    assert last.startswith("tailtrain launch: error: "), done[1].stderr[-3000:]
    assert "asked to join the live ranks" in done[1].stderr
    kept = {r: torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)}
    assert not (tmp_path / "rank2.pt").exists() and not (tmp_path / "rank3.pt").exists()
    for name, value in kept[0]["model"].items():
        assert torch.equal(value, kept[1]["model"][name]), name
