"""The shrink conformance table (issue 35): every (host, strategy, backend) cell either shrinks
or refuses in one line before any rank starts or any round runs. The hosts are ``train`` on
each runtime topology, a user's own loop (``integrate.StragglerStep``) and a user's sharded
loop (``integrate.ShardedStep``, whose worker is a replica group); every one of them
takes its refusals from ``runtime.elastic.refusals``, so nccl and CUDA are refused alike
everywhere (they were not: ``train --backend nccl --on-rank-loss shrink`` passed validation on
the allreduce and then formed gloo groups).

The table's cells are checked without a process (the answer before anything starts); three
of its "shrinks" cells, one per host, are run end to end with a rank killed (slow).
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tailtrain.core.scenario import Scenario
from tailtrain.errors import UsageError
from tailtrain.faults import FaultPlan
from tailtrain.integrate import StragglerStep
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.launching.checks import validate
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.launch import launch
from tailtrain.strategies.registry import parse_strategy

ROOT = Path(__file__).resolve().parents[3]
SHRINKS = "shrinks"
GLOO = "forms each new generation's groups with gloo on CPU tensors"
LARGER = "dropcompute:threshold=0.2,compensate=larger-batch"
FOLLOW = "cannot follow a smaller world"
#: (host, strategy, where its buffers live, the answer: SHRINKS or a piece of the one line).
#: ``train-*`` names the topology ``train`` runs the strategy on
TABLE = [
    ("train-allreduce", "sync", {}, SHRINKS),
    ("train-allreduce", "dropcompute:threshold=0.3", {}, SHRINKS),
    ("train-allreduce", "local-sgd:period=2", {}, SHRINKS),
    ("train-allreduce", "rebalance", {}, SHRINKS),
    ("train-allreduce", "rebalance:deal=demand", {}, SHRINKS),  # the global batch kept
    ("train-allreduce", LARGER, {}, FOLLOW),
    ("train-allreduce", "rebalance:then=dropcompute,defer=true", {}, FOLLOW),
    ("train-allreduce", "sync", {"backend": "nccl"}, GLOO),
    ("train-allreduce", "sync", {"device": "cuda"}, GLOO),
    ("train-partial-collective", "eager:mode=majority", {}, SHRINKS),
    ("train-partial-collective", "eager:mode=solo", {}, SHRINKS),
    ("train-partial-collective", "dbw-quorum", {}, FOLLOW),
    ("train-partial-collective", "eager:mode=majority", {"backend": "nccl"}, GLOO),
    ("train-partial-collective", "eager:mode=majority", {"device": "cuda"}, GLOO),
    ("train-parameter-server", "lgc:k=2", {}, "for the allreduce and partial-collective"),
    ("step", "sync", {}, SHRINKS),
    ("step", "dropcompute:threshold=0.3", {}, SHRINKS),
    ("step", "local-sgd:period=2", {}, SHRINKS),
    ("step", "rebalance", {}, "per-rank shares the loader draws"),
    ("step", "rebalance:deal=demand", {}, SHRINKS),  # a redone round deals its positions again
    ("step", LARGER, {}, "compensate=larger-batch changes which micro-batches"),
    ("step", "eager:mode=majority", {}, "a training loop adopts allreduce strategies"),
    ("step", "sync", {"backend": "nccl"}, GLOO),
    ("step", "sync", {"device": "cuda"}, GLOO),
    ("sharded", "sync", {}, SHRINKS),
    ("sharded", "dropcompute:threshold=0.3", {}, SHRINKS),
    ("sharded", "dropcompute:threshold=auto", {}, SHRINKS),
    ("sharded", "local-sgd:period=2", {}, SHRINKS),
    ("sharded", "rebalance", {}, "per-rank shares the loader draws"),
    ("sharded", "rebalance:deal=demand", {}, "does not deal 'rebalance:deal=demand' again"),
    ("sharded", "sync", {"backend": "nccl"}, GLOO),
    ("sharded", "sync", {"device": "cuda"}, GLOO),
    ("sharded", "sync", {"restart": "1"}, "does not take a group started again back"),
]


def cell_id(cell) -> str:
    host, strategy, where, _ = cell
    return "-".join([host, strategy, *where.values()])


def train_answer(host: str, strategy: str, where: dict[str, str]) -> str:
    """``train``'s answer before any rank starts (``runtime.launching.checks.validate``)."""
    assert host == f"train-{parse_strategy(strategy).topology}"  # the cell's topology
    # M micro-batches where a rule asks for them (larger-batch scales M)
    m = {"micro_batches": 2} if host == "train-allreduce" else {}
    scenario = Scenario(task="logreg", workers=3, iterations=2, **m)
    try:
        validate(TrainConfig(scenario, strategy, on_rank_loss="shrink", **where), local=True)
    except UsageError as exc:
        return str(exc)
    return SHRINKS


@pytest.fixture
def launched(monkeypatch):
    """This process as the one rank of a ``tailtrain launch --on-rank-loss shrink`` job: a
    gloo group of itself and the launcher's store (a StragglerStep that shrinks opens it)."""
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=10),
    )  # fmt: skip
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("TAILTRAIN_ON_RANK_LOSS", "shrink")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    yield monkeypatch
    dist.destroy_process_group()


def step_answer(monkeypatch, strategy: str, where: dict[str, str]) -> str:
    """``StragglerStep(on_rank_loss="shrink")``'s answer before its first round. No GPU here:
    a job on nccl is the group's backend named so, a model off the CPU one on the meta
    device (what the check reads is the parameters' device type)."""
    device = "meta" if where.get("device") == "cuda" else "cpu"
    if where.get("backend") == "nccl":
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    net = torch.nn.Linear(2, 2, device=device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    try:
        StragglerStep(net, optimizer, strategy, on_rank_loss="shrink", micro_batches=2)
    except UsageError as exc:
        return str(exc)
    return SHRINKS


def sharded_answer(monkeypatch, strategy: str, where: dict[str, str]) -> str:
    """``ShardedStep(on_rank_loss="shrink")``'s answer before its first round, on a 1 x 1
    mesh of this process (a model on the meta device stands for one off the CPU)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tailtrain.integrate import ShardedStep
    from tailtrain.runtime.elastic.store import REJOIN

    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    device = "meta" if where.get("device") == "cuda" else "cpu"
    net = fully_shard(torch.nn.Linear(2, 2, device=device), mesh=mesh["shard"])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    if where.get("backend") == "nccl":
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    if where.get("restart"):
        monkeypatch.setenv(REJOIN, "1")
    try:
        step = ShardedStep(
            net, optimizer, strategy, mesh=mesh, on_rank_loss="shrink", micro_batches=2
        )
    except UsageError as exc:
        return str(exc)
    assert step.membership is not None  # it shrinks: the group membership started
    return SHRINKS


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cell", [c for c in TABLE if c[0].startswith("train")], ids=cell_id)
def test_train_shrinks_or_refuses_in_one_line(cell):
    host, strategy, where, want = cell
    got = train_answer(host, strategy, where)
    assert "\n" not in got and want in got, got


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cell", [c for c in TABLE if c[0] in ("step", "sharded")], ids=cell_id)
def test_a_users_loop_shrinks_or_refuses_in_one_line(launched, cell):
    """``StragglerStep`` (``step``) and ``ShardedStep`` (``sharded``) in a user's loop."""
    host, strategy, where, want = cell
    answer = step_answer if host == "step" else sharded_answer
    got = answer(launched, strategy, where)
    assert "\n" not in got and want in got, got


def test_every_host_refuses_nccl_and_cuda_with_the_same_line():
    """One refusal for every host (``runtime.elastic.refusals.check_gloo_cpu``)."""
    hosts = {c[0].split("-")[0] for c in TABLE if c[3] == GLOO}
    assert hosts == {"train", "step", "sharded"}
    wheres = {(c[0], tuple(c[2])) for c in TABLE if c[3] == GLOO}
    assert {w for _, w in wheres} == {("backend",), ("device",)}


# ---- the "shrinks" cells, end to end: one rank killed, the others go on ------------------------
def killed_train(strategy: str, **scenario) -> list[dict]:
    s = Scenario(task="logreg", workers=3, iterations=8, eval_every=1000, **scenario)
    cfg = TrainConfig(
        scenario=s,
        strategy=strategy,
        seed=1,
        timeout=60,
        faults=FaultPlan.parse(["kill:worker=2,step=3"], 3),
        on_rank_loss="shrink",
        inject="delay" in scenario,
    )
    by_rank = launch([cfg], reserve(Endpoint("127.0.0.1", 0)))
    return by_rank[0][0].record.steps


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("strategy", "scenario"),
    [("dropcompute:threshold=0.3", {}), ("eager:mode=majority", {"delay": "exp:rate=40"})],
    ids=["train-allreduce", "train-partial-collective"],
)
def test_train_shrinks_where_its_cell_says(strategy, scenario):
    steps = killed_train(strategy, **scenario)
    assert [r["step"] for r in steps] == list(range(8))
    assert [r["dead"] for r in steps if r["dead"]] == [[2]]
    assert sorted(steps[-1]["live"]) == [0, 1]


@pytest.mark.slow  # three ranks that each import torch and sklearn
@pytest.mark.timeout(300)
def test_a_users_loop_shrinks_where_its_cell_says(tmp_path):
    command = [
        sys.executable, "-m", "tailtrain", "launch", "--nproc-per-node", "3",
        "--on-rank-loss", "shrink", str(ROOT / "examples" / "shrink_loop.py"),
        "--steps", "8", "--kill-rank", "2", "--kill-step", "3", "--out", str(tmp_path),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    records = torch.load(tmp_path / "rank0.pt", weights_only=False)["records"]
    assert [r["step"] for r in records] == list(range(8))
    assert [(r["step"], r["lost"]) for r in records if r["lost"]] == [(3, [2])]
    assert records[-1]["live"] == [0, 1]
