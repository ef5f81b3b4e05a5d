"""``advise --for``: only what the job can run, and the printed lines run as printed (two real
gloo ranks execute them in a DDP job and in an own loop)."""

from __future__ import annotations

import datetime
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from tests.integrate.ranks import no_garbage_inherited
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tailtrain.advice import advise
from tailtrain.advice.adopt import adoption
from tailtrain.errors import UsageError
from tailtrain.strategies.registry import parse_strategy

N, M = 2, 3
#: the families each job can run, as advise offered them before it asked the entries
#: (``strategies.entries``): an independent reference for the query
FAMILIES = {
    "ddp": {"sync", "dropcompute", "rebalance"},
    "loop": {"sync", "dropcompute", "local-sgd", "rebalance"},
}


@pytest.fixture(scope="module")
def micro_trace(tmp_path_factory):
    """4 workers, 40 iterations of 3 micro-batches; worker 2 stalls 5x in 15% of iterations
    (intermittent: a stall per micro-batch would slow 49% of its iterations, which
    ``tailtrain.persistence`` rightly calls persistent, and advise --for loop then deals
    shares instead)."""
    rng = np.random.default_rng(5)
    seconds = rng.lognormal(-4.0, 0.1, (40, 4, M))
    seconds[:, 2] *= 1 + 4 * (rng.random((40, 1)) < 0.15)
    i, w, m = np.meshgrid(np.arange(40), np.arange(4), np.arange(M), indexing="ij")
    path = tmp_path_factory.mktemp("adopt") / "trace.csv"
    table = np.column_stack([i.ravel(), w.ravel(), m.ravel(), seconds.ravel()])
    header = "iteration,worker,micro_batch,seconds"
    np.savetxt(
        path, table, fmt=["%d", "%d", "%d", "%.9f"], delimiter=",", header=header, comments=""
    )
    return path


@pytest.fixture(scope="module")
def advised(micro_trace):
    return {setup: advise(micro_trace, setup=setup, samples=400) for setup in ("ddp", "loop")}


@pytest.mark.timeout(300)
def test_a_ddp_job_is_only_offered_what_a_ddp_job_can_run(advised):
    for setup, found in advised.items():
        assert {r.row.strategy for r in found.ranked} <= FAMILIES[setup]
        assert found.choice.row.strategy in FAMILIES[setup]
        assert found.to_json()["adopt"]["lines"] == found.adopt.lines()
    with pytest.raises(UsageError, match="cannot run"):
        adoption("k-sync:k=2", "k-sync", "ddp")


def run_lines(rank: int, port: int, lines: dict[str, list[str]], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=N,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    thetas = {}
    for setup, code in lines.items():
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        ddp = DistributedDataParallel(model) if setup == "ddp" else None
        job = {
            "model": model,
            "ddp": ddp,
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "loss_fn": lambda net, b: F.mse_loss(net(b[0]), b[1]),
        }
        once, step = code[: code.index("# each step:")], code[code.index("# each step:") + 1 :]
        exec("\n".join(once), job)  # the printed lines, as printed
        for s in range(3):
            g = torch.Generator().manual_seed(10 * s + rank)
            job["micro_batches"] = [(torch.randn(4, 4, generator=g), torch.randn(4, 2, generator=g))
                                    for _ in range(M)]  # fmt: skip
            exec("\n".join(step), job)
        thetas[setup] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.save(thetas, f"{out}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(300)
def test_the_printed_lines_run_in_the_job_they_are_for(advised, tmp_path):
    lines = {setup: found.adopt.lines() for setup, found in advised.items()}
    assert lines["ddp"][0] == "from tailtrain import StragglerHookState, weighted_allreduce_hook"
    with no_garbage_inherited():
        mp.start_processes(
            run_lines, (free_port(), lines, str(tmp_path)), nprocs=N, start_method="fork"
        )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(N)]
    for setup in lines:
        assert torch.isfinite(ranks[0][setup]).all()
        assert torch.equal(ranks[0][setup], ranks[1][setup])  # one model: the lines reduce


def test_the_fixture_recommends_dropcompute_so_the_lines_change_the_step(advised):
    assert {found.choice.row.strategy for found in advised.values()} == {"dropcompute"}


@pytest.mark.parametrize(
    ("spec", "family", "m", "shares"),
    [
        ("dropcompute:threshold=0.05", "dropcompute", 4, None),
        ("rebalance", "rebalance", None, (48, 16)),
    ],
)
def test_lightning_s_lines_build_the_strategy_they_name(spec, family, m, shares):
    """``--for lightning``'s lines, run as printed with a ``Trainer`` that records its
    arguments: a ``StragglerStrategy`` of the spec (and the shares), at
    ``accumulate_grad_batches=M`` where DropCompute needs micro-batches."""
    from tailtrain.lightning import StragglerStrategy

    lines = adoption(spec, family, "lightning", m, shares).lines()
    assert lines[0] == "from tailtrain.lightning import StragglerStrategy"
    built = {}
    job = {"Trainer": lambda *args, **kwargs: built.update(kwargs)}
    exec("\n".join(lines), job)
    strategy = built["strategy"]
    assert isinstance(strategy, StragglerStrategy)
    assert built.get("accumulate_grad_batches") == m
    assert strategy.rule.describe() == parse_strategy(spec).describe()
    assert strategy.shares == (None if shares is None else list(shares))


@pytest.mark.parametrize(
    ("accumulation", "m", "resize"),
    [(1, 4, "divided by 4"), (4, 8, "divided by 2"), (4, 2, "times 2"), (4, 4, None)],
)
def test_lightning_s_batch_size_keeps_the_samples_of_a_step(accumulation, m, resize):
    """A Lightning job that accumulates k loader batches a step, priced at M micro-batches:
    the loader's batch is resized by k / M, so a step keeps its samples (a newcomer's job with
    k = 4 was told to divide its batch by M, a step then M / k times too small)."""
    lines = adoption("dropcompute:threshold=0.05", "dropcompute", "lightning", m, None,
                     accumulation).lines()  # fmt: skip
    assert f"accumulate_grad_batches={m}," in lines[1]
    resizing = [line for line in lines if "batch_size" in line]
    if resize is None:
        assert resizing == []
    else:
        assert len(resizing) == 1 and f"batch_size {resize}:" in resizing[0]


def test_dropcompute_s_note_under_lightning_says_where_it_cuts():
    """``--for lightning`` on an accumulating job: StragglerStrategy cuts between its
    accumulated batches, which the DDP hook's note said it could not."""
    from tailtrain.advice.job_rows import ACCUMULATED_NOTE, LIGHTNING_NOTE, dropcompute_note
    from tailtrain.advice.units import JobShape

    job = JobShape(2, 1, np.array([128, 128]), accumulation=4)
    assert dropcompute_note(job, "lightning") == LIGHTNING_NOTE
    assert dropcompute_note(job, "ddp") == ACCUMULATED_NOTE


def test_hf_s_dropcompute_lines_are_the_ddp_job_s_under_a_line_that_says_where_they_go():
    ddp = adoption("dropcompute:threshold=0.05", "dropcompute", "ddp", 4).lines()
    hf = adoption("dropcompute:threshold=0.05", "dropcompute", "hf", 4)
    assert hf.lines()[0].startswith("# transformers' Trainer cannot run this in its loop")
    assert hf.lines()[1:] == ddp and hf.edits() == []
    keep = adoption("sync", "sync", "hf").lines()
    assert keep == ["# keep your Trainer as it is: sync is what it runs"]


def test_hf_s_rebalance_line_is_the_trainer_subclass_with_the_shares(monkeypatch):
    """``--for hf`` rebalances inside the Trainer: the lines, run as printed with a stand-in
    for ``RebalancedTrainer`` that records its arguments, pass the shares as a keyword in
    place of ``Trainer(...)``, and name the per-device batch they sum to N times."""
    lines = adoption("rebalance", "rebalance", "hf", None, (14, 2)).lines()
    assert lines == [
        "from tailtrain.hf import RebalancedTrainer",
        "trainer = RebalancedTrainer(..., shares=[14, 2])  "
        "# was: Trainer(...), per_device_train_batch_size=8",
        "# a Trainer subclass of your own: derive it from RebalancedTrainer, the same shares=",
    ]
    uneven = adoption("rebalance", "rebalance", "hf", None, (5, 2)).lines()
    assert uneven[1].endswith("# was: Trainer(...)")
    hf = pytest.importorskip("tailtrain.hf")  # the hf extra
    built = {}
    monkeypatch.setattr(hf, "RebalancedTrainer", lambda *a, **kw: built.update(kw))
    exec("\n".join(lines), {})
    assert built == {"shares": [14, 2]}


def test_fsdp_s_lines_build_a_sharded_step_of_the_spec():
    """``--for fsdp``'s lines name ``ShardedStep`` with the spec and the mesh, and say how
    many micro-batches a step takes (its run on a (2, 2) mesh: tests/integrate/test_sharded)."""
    lines = adoption("dropcompute:threshold=0.05", "dropcompute", "fsdp", 4).lines()
    assert lines[0] == "from tailtrain import ShardedStep"
    assert lines[1].startswith(
        'step = ShardedStep(model, optimizer, "dropcompute:threshold=0.05", mesh=mesh)'
    )
    assert lines[2] == "# each step (its batch split in M=4 micro-batches):"
    shares = adoption("rebalance", "rebalance", "fsdp").lines()
    assert "mesh=mesh, micro_batches=M)" in shares[1] and "step.wants" in shares[2]
    local = adoption("local-sgd:period=2", "local-sgd", "fsdp", 8).lines()
    assert "H=2 local steps of M=8 micro-batches each: give it 2 x 8" in local[2]
    demand = adoption("rebalance:deal=demand", "rebalance", "fsdp").lines()
    assert '"rebalance:deal=demand", mesh=mesh, micro_batches=M)' in demand[1]
    assert "stream by position" in demand[2] and "step.wants" not in demand[2]
    with pytest.raises(UsageError, match="cannot run"):
        adoption("k-sync:k=2", "k-sync", "fsdp")


def test_an_own_loop_deals_on_demand_from_its_stream():
    """``--for loop`` with ``rebalance:deal=demand``: StragglerStep at sync's M, each call
    given the job's stream by position (no ShareSampler: the step deals what ranks ask for)."""
    lines = adoption("rebalance:deal=demand", "rebalance", "loop").lines()
    assert lines[0] == "from tailtrain import StragglerStep"
    assert lines[1] == (
        'step = StragglerStep(model, optimizer, "rebalance:deal=demand", micro_batches=M)'
    )
    assert "stream[i] the same on every rank" in lines[2]
    assert lines[3] == "step(stream, lambda batch: loss_fn(model, batch))"
    assert not any("ShareSampler" in line for line in lines)
