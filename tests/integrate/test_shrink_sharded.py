"""``ShardedStep(on_rank_loss="shrink")`` under ``tailtrain launch --on-rank-loss shrink``: a
rank SIGKILLed inside a step makes its replica group leave whole, and the other group goes on
with the step computed again; the survivors agree on every record, hold the same full
parameters, and equal, to the bit, a single-process reference rebuilt from the records (which
groups contributed to each step, with which weights). The first rank's death, and a whole group's
two deaths at once, are among the cases."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.integrate.ranks import free_port
from tests.integrate.sharded_reference import grads_of, update

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sharded_shrink_loop.py"
DRILL = Path(__file__).with_name("sharded_drill.py")  # a death the loop cannot stage
#: a 2 x 2 mesh: group 0 is ranks 0-1, group 1 ranks 2-3
WORLD, SHARDS, AT, STEPS = 4, 2, 4, 8


def example():
    """examples/sharded_shrink_loop.py as a module: its model, data and micro-batches."""
    spec = importlib.util.spec_from_file_location("sharded_shrink_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def killed(out: Path, victims: list[int], strategy: str = "sync") -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    command = [
        sys.executable, "-m", "tailtrain", "launch", "--nproc-per-node", str(WORLD),
        "--on-rank-loss", "shrink", str(EXAMPLE), "--steps", str(STEPS), "--strategy", strategy,
        "--kill-rank", *map(str, victims), "--kill-step", str(AT), "--out", str(out),
    ]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)


def rebuilt(m, records: list[dict]) -> dict[str, torch.Tensor]:
    """SGD with momentum on each record's update over the groups it names (``live``,
    ``ranks``), in the run's own arithmetic (``sharded_reference``)."""
    x, y = m.digits()
    net = m.make_model()
    optimizer = torch.optim.SGD(net.parameters(), lr=m.LR, momentum=m.MOMENTUM)
    for record in records:

        def unit(n: int, s: int, u: int, record=record) -> list[torch.Tensor]:
            bx, by = m.micro_batches(x, y, record["live"][n], s, record["step"])[u]
            return grads_of(net, lambda: F.cross_entropy(net(bx), by))

        step = update(record, unit, SHARDS)
        for p, t in zip(net.parameters(), step, strict=True):
            p.grad = t
        optimizer.step()
    return dict(net.named_parameters())


def survivors_agree(out: Path, ranks: list[int]) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """The records and full parameters of ``ranks``, which alone wrote theirs: the same on
    each of them."""
    assert sorted(int(f.stem[4:]) for f in out.glob("rank*.pt")) == ranks
    kept = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in ranks]
    for other in kept[1:]:
        assert other["records"] == kept[0]["records"]
        for name, value in kept[0]["model"].items():
            assert torch.equal(other["model"][name], value), name
    return kept[0]["records"], kept[0]["model"]


def matches_reference(full: dict[str, torch.Tensor], records: list[dict]) -> None:
    """``full`` equals, to the bit, the reference from all the records, and not the one from
    all but the last (a step missed or taken twice moves it far beyond a few ulps)."""
    m = example()
    for name, value in rebuilt(m, records).items():
        assert torch.equal(full[name], value.detach()), name
    short = rebuilt(m, records[:-1])
    close = {"rtol": 1e-3, "atol": 1e-5}
    assert any(not torch.allclose(full[n], v.detach(), **close) for n, v in short.items())


@pytest.mark.slow  # four ranks that each import torch and sklearn: ~15 s on a quiet machine
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("victims", "strategy", "goes_on"),
    [
        ([3], "sync", 0),
        ([0], "dropcompute:threshold=10", 1),  # the first rank: no rank is special
        ([2, 3], "sync", 0),  # a whole group, two deaths at once
    ],
    ids=["rank-3", "rank-0", "ranks-2-3"],
)
def test_a_killed_rank_makes_its_group_leave_and_the_other_goes_on(
    tmp_path, victims, strategy, goes_on
):
    done = killed(tmp_path, victims, strategy)
    assert done.returncode == 0, done.stderr[-3000:]
    lost = 1 - goes_on
    group = [lost * SHARDS + s for s in range(SHARDS)]
    ranks = [goes_on * SHARDS + s for s in range(SHARDS)]
    for v in victims:
        assert f"rank {v} died (killed by SIGKILL)" in done.stderr
    for r in set(group) - set(victims):  # its mate leaves, alive: no death
        assert f"rank {r} left the job: rank {r} leaves with its replica group" in done.stderr
    assert f"ranks {ranks} went on from step {AT} (generation 1)" in done.stderr
    records, full = survivors_agree(tmp_path, ranks)
    assert [r["step"] for r in records] == list(range(STEPS))
    assert all(r["live"] == [0, 1] and r["weights"] == [0.5, 0.5] for r in records[:AT])
    assert all(r["live"] == [goes_on] and r["weights"] == [1.0] for r in records[AT:])
    # the step the kill broke was computed again by the group that goes on; it names the lost
    assert [r["step"] for r in records if r["redone"]] == [AT]
    assert [(r["step"], r["lost"]) for r in records if r["lost"]] == [(AT, [lost])]
    matches_reference(full, records)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_lost_in_each_group_leaves_no_group_and_the_job_says_so(tmp_path):
    """Ranks 1 and 2 die at once: neither group is whole, so none goes on; every rank left
    alive leaves, and the launcher says that no rank finished."""
    done = killed(tmp_path, [1, 2])
    assert done.returncode != 0
    assert "no rank finished" in done.stderr
    assert "Traceback" not in done.stderr.split("tailtrain launch:")[-1]
    assert not list(tmp_path.glob("rank*.pt"))


@pytest.mark.slow  # two launchers and four ranks
@pytest.mark.timeout(300)
def test_across_nodes_a_group_per_node_leaves_with_its_node_and_the_other_goes_on(tmp_path):
    """HSDP across machines: each replica group is a node, its own ``tailtrain launch
    --nnodes 2`` on a loopback address of its own. Rank 3 dies; its node leaves (its launcher
    stops rank 2 and exits non-zero with one line), and node 0's group goes on."""
    port = free_port("127.0.0.2")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    procs = []
    for node in range(2):
        command = [
            sys.executable, "-m", "tailtrain", "launch", "--nnodes", "2",
            "--node-rank", str(node), "--nproc-per-node", str(SHARDS),
            "--rdzv-endpoint", f"127.0.0.2:{port}", "--on-rank-loss", "shrink",
            "--timeout", "120", str(EXAMPLE), "--steps", str(STEPS), "--kill-rank", "3",
            "--kill-step", str(AT), "--out", str(tmp_path),
        ]  # fmt: skip
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        procs.append(subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, **pipes))
    done = [p.communicate(timeout=240) for p in procs]
    assert procs[0].returncode == 0, done[0][1][-3000:]
    assert procs[1].returncode == 1
    said = done[1][1].strip().splitlines()[-1]
    assert said.startswith("tailtrain launch: error: this node left the job: rank 3 died")
    records, full = survivors_agree(tmp_path, [0, 1])
    assert [(r["step"], r["lost"], r["redone"]) for r in records if r["lost"]] == [(AT, [1], True)]
    assert all(r["live"] == [0] for r in records[AT:])
    matches_reference(full, records)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["timing", "before", "after"])
def test_a_death_at_the_commit_leaves_every_survivor_at_the_same_step(tmp_path, when):
    """Rank 3 dies in step AT (``sharded_drill.py``). ``timing``: inside the round's last
    gather, after its group's part: shard 0's ranks complete the round, shard 1's do not, and
    without the commit rank 0 would apply step AT while rank 1 did not. ``before`` its vote,
    every collective of the round completed everywhere: nobody applies step AT, and group 0
    computes it again alone. ``after``: step AT is applied everywhere with both groups, and
    the group leaves in step AT + 1, which group 0 computes again. Either way the survivors'
    parameters equal the reference from the records: no step half-applied, none twice."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DRILL_RANK="3", DRILL_STEP=str(AT))
    env["DRILL_WHEN"] = when
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    command = [
        sys.executable, "-m", "tailtrain", "launch", "--nproc-per-node", str(WORLD),
        "--on-rank-loss", "shrink", str(DRILL), "--steps", str(STEPS), "--out", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    broke = AT + 1 if when == "after" else AT
    records, full = survivors_agree(tmp_path, [0, 1])
    assert [(r["step"], r["lost"], r["redone"]) for r in records if r["lost"]] == [
        (broke, [1], True)
    ]
    assert [r["live"] for r in records] == [[0, 1]] * broke + [[0]] * (STEPS - broke)
    matches_reference(full, records)
