"""``StragglerStep(on_rank_loss="shrink")`` under ``tailtrain launch --on-rank-loss shrink``:
a rank SIGKILLed inside a step leaves survivors that finish with N - 1 ranks, agree on every
record, hold equal parameters, and equal a reference rebuilt from the records (which ranks
contributed to each step); with ``--restart-lost`` the killed rank comes back and heals from a
live peer; the one-line refusals where shrinking cannot work."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tailtrain.errors import UsageError
from tailtrain.integrate import StragglerStep
from tailtrain.runtime.elastic.shrink import Census
from tailtrain.runtime.reduce import PeerFailure

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "shrink_loop.py"
#: three ranks, rank 1 killed inside step 6 (of the example's 40)
N, VICTIM, AT = 3, 1, 6


def example():
    """examples/shrink_loop.py as a module: its model, data and micro-batches."""
    spec = importlib.util.spec_from_file_location("shrink_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def environment() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def healed(out: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict[int, dict]]:
    """The example under ``tailtrain launch --restart-lost 1``, rank VICTIM killed inside step
    AT and started again: the launch (which must succeed, the rank rejoining) and every
    rank's saved state."""
    command = [
        sys.executable, "-m", "tailtrain", "launch", "--nproc-per-node", str(N),
        "--on-rank-loss", "shrink", "--restart-lost", "1", str(EXAMPLE),
        "--kill-rank", str(VICTIM), "--kill-step", str(AT), *options, "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"rank {VICTIM} rejoined the live ranks at step " in done.stderr
    return done, {r: torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(N)}


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    out = tmp_path_factory.mktemp("shrink")
    command = [
        sys.executable, "-m", "tailtrain", "launch", "--nproc-per-node", str(N),
        "--on-rank-loss", "shrink", str(EXAMPLE),
        "--kill-rank", str(VICTIM), "--kill-step", str(AT), "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=280
    )
    files = {r: out / f"rank{r}.pt" for r in range(N)}
    return done, {r: torch.load(f, weights_only=False) for r, f in files.items() if f.exists()}


@pytest.mark.slow  # three ranks that each import torch and sklearn: ~10 s on a quiet machine
@pytest.mark.timeout(300)
def test_a_killed_rank_leaves_survivors_that_equal_the_reference_from_the_records(killed):
    done, kept = killed
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"rank {VICTIM} died (killed by SIGKILL); noted dead for the live ranks" in done.stderr
    # said once it held, by the launcher: the survivors' generation without it
    assert f"ranks [0, 2] went on from step {AT} (generation " in done.stderr
    survivors = [r for r in range(N) if r != VICTIM]
    assert sorted(kept) == survivors  # the killed rank wrote nothing
    records = [kept[r]["records"] for r in survivors]
    assert all(r == records[0] for r in records)  # every record agreed on
    records = records[0]
    m = example()
    assert [r["step"] for r in records] == list(range(m.STEPS))
    assert all(r["live"] == list(range(N)) for r in records[:AT])
    assert all(r["live"] == survivors for r in records[AT:])
    # the round the kill broke was computed again by the survivors; it names the lost rank
    assert [r["step"] for r in records if r["redone"]] == [AT]
    assert [r["step"] for r in records if r["lost"]] == [AT] and records[AT]["lost"] == [VICTIM]
    # equal parameters on every survivor
    models = [kept[r]["model"] for r in survivors]
    for name, value in models[0].items():
        assert all(torch.equal(value, other[name]) for other in models[1:]), name
    matches_reference(models[0], lambda rows: rebuilt(m, rows), records)


def matches_reference(
    state: dict[str, torch.Tensor],
    rebuild: Callable[[list[dict]], dict[str, torch.Tensor]],
    records: list[dict],
) -> None:
    """``state`` equals the reference rebuilt from all the records, and not the one rebuilt
    from all but the last: gloo sums the ranks' buckets in its own order, so the reference
    agrees to a few ulps of the sums only, while a step missed or taken twice moves the
    parameters by far more than the tolerance."""
    close = {"rtol": 1e-3, "atol": 1e-5}
    for name, value in rebuild(records).items():
        torch.testing.assert_close(state[name], value, **close)
    short = rebuild(records[:-1])
    assert any(not torch.allclose(state[name], value, **close) for name, value in short.items()), (
        "one step less is within the tolerance: the check above could not fail"
    )


def rebuilt(m, records: list[dict], world: int = N) -> dict[str, torch.Tensor]:
    """A reference: SGD with momentum on sum_n w_n G_n over the ranks each record names, of a
    job of ``world`` ranks (each its own shard)."""
    x, y, _, _ = m.digits()
    return replayed(m, records, lambda r, n: m.micro_batches(x, y, r["live"][n], world, r["step"]))


def replayed(m, records: list[dict], batches_of: Callable) -> dict[str, torch.Tensor]:
    """SGD with momentum on sum_n w_n G_n, G_n the mean gradient over ``batches_of(record,
    n)``, rank n's micro-batches of that record's step."""
    net = m.make_model()
    optimizer = torch.optim.SGD(net.parameters(), lr=m.LR, momentum=m.MOMENTUM)
    for record in records:
        total = [torch.zeros_like(p) for p in net.parameters()]
        for n in record["ranks"]:
            batches, weight = batches_of(record, n), record["weights"][n]
            net.zero_grad()
            for bx, by in batches:
                F.cross_entropy(net(bx), by).backward()
            for t, p in zip(total, net.parameters(), strict=True):
                t.add_(p.grad, alpha=weight / len(batches))
        for p, t in zip(net.parameters(), total, strict=True):
            p.grad = t
        optimizer.step()
    return net.state_dict()


@pytest.mark.slow  # three ranks importing torch and sklearn, and one of them a fourth time
@pytest.mark.timeout(300)
def test_a_killed_rank_started_again_heals_from_a_live_peer_and_the_group_grows_back(tmp_path):
    """Rank 1 is SIGKILLed inside step 6 and started again (``--restart-lost 1``): it joins
    the two survivors at a step boundary, takes the lead's model, optimizer and rule state (not
    from disk), and the three finish with equal parameters and the same records from its join
    on, each equal to the reference rebuilt from the records."""
    done, kept = healed(tmp_path, "--rejoin-steps", "5")
    assert f"rank {VICTIM} died (killed by SIGKILL); started again (1 of 1)" in done.stderr
    records = kept[0]["records"]
    assert all(kept[r]["records"] == records for r in range(N) if r != VICTIM)
    back = kept[VICTIM]["records"]
    at = back[0]["step"]  # the first step after the heal, on every rank alike
    assert back == records[at:] and len(back) >= 5
    assert [(r["step"], r["rejoined"]) for r in records if r["rejoined"]] == [(at, [VICTIM])]
    assert [(r["step"], r["lost"], r["redone"]) for r in records if r["lost"]] == [
        (AT, [VICTIM], True)
    ]
    survivors = [r for r in range(N) if r != VICTIM]
    assert [r["live"] for r in records] == (
        [list(range(N))] * AT + [survivors] * (at - AT) + [list(range(N))] * len(back)
    )
    models = [kept[r]["model"] for r in range(N)]
    for name, value in models[0].items():
        assert all(torch.equal(value, other[name]) for other in models[1:]), name
    matches_reference(models[0], lambda rows: rebuilt(example(), rows), records)


@pytest.mark.slow  # three ranks importing torch and sklearn, and one of them a fourth time
@pytest.mark.timeout(300)
@pytest.mark.parametrize("overflow", [2, AT], ids=["before-the-death", "in-the-redone-round"])
def test_a_rank_healed_from_a_live_peer_takes_its_grad_scalers_scale(tmp_path, overflow):
    """Under a GradScaler rank 0's loss overflows in step ``overflow``: every rank's scaler
    skips that update and halves its scale (at AT, the step rank 1 dies in, the survivors'
    redone round does). Rank 1, started again, must take that scale with the model (each rank
    scales its gradients by its own scale before the sum): after the heal every rank holds
    the same scale and the same parameters."""
    _, kept = healed(tmp_path, "--rejoin-steps", "3", "--overflow-step", str(overflow))
    if overflow == AT:
        redone = [r for r in kept[0]["records"] if r["redone"]]
        assert [r["step"] for r in redone] == [AT]
    initial = torch.amp.GradScaler("cpu").get_scale()
    assert [kept[r]["scale"] for r in range(N)] == [initial / 2] * N
    models = [kept[r]["model"] for r in range(N)]
    for name, value in models[0].items():
        assert all(torch.equal(value, other[name]) for other in models[1:]), name


# ---- one-line refusals ----------------------------------------------------------------------
@pytest.fixture
def alone():
    """A process group of this process alone (gloo)."""
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=10),
    )  # fmt: skip
    yield
    dist.destroy_process_group()


def refusal(monkeypatch, launched: str | None, strategy="sync", on_rank_loss="shrink") -> str:
    if launched is None:
        monkeypatch.delenv("TAILTRAIN_ON_RANK_LOSS", raising=False)
    else:
        monkeypatch.setenv("TAILTRAIN_ON_RANK_LOSS", launched)
    net = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(UsageError) as caught:
        StragglerStep(net, optimizer, strategy, on_rank_loss=on_rank_loss, micro_batches=2)
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.timeout(30)
def test_shrink_is_refused_in_one_line_where_it_cannot_work(alone, monkeypatch):
    assert "tailtrain launch --nproc-per-node N --on-rank-loss shrink" in refusal(monkeypatch, None)
    assert "tailtrain launch" in refusal(monkeypatch, "stop")
    assert "on_rank_loss must be one of stop, shrink" in refusal(
        monkeypatch, None, on_rank_loss="grow"
    )
    assert "per-rank shares" in refusal(monkeypatch, "shrink", strategy="rebalance")
    assert "rebalance:deal=demand" in refusal(monkeypatch, "shrink", strategy="rebalance")


@pytest.mark.timeout(30)
def test_shrink_is_taken_under_the_launcher(alone, monkeypatch):
    monkeypatch.setenv("TAILTRAIN_ON_RANK_LOSS", "shrink")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    net = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    step = StragglerStep(net, optimizer, "sync", on_rank_loss="shrink")
    record = step([(torch.ones(2), torch.zeros(1))], lambda b: F.mse_loss(net(b[0]), b[1]))
    assert (record.live, record.lost, record.redone) == ([0], [], False)
    assert step.live == (0,) and step.shrinker is not None


@pytest.mark.timeout(30)
def test_a_rank_behind_the_lead_does_not_name_the_ranks_lost_before_twice(alone, monkeypatch):
    """A second death in the round redone after a shrink, which the lead completed and this
    rank did not: the lead's record that this rank returns already names the rank the first
    shrink lost, so its next record names only the rank lost now, as the lead's next does."""
    monkeypatch.setenv("TAILTRAIN_ON_RANK_LOSS", "shrink")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    net = torch.nn.Linear(2, 1)
    step = StragglerStep(
        net, torch.optim.SGD(net.parameters(), lr=0.1), "sync", on_rank_loss="shrink"
    )
    batches = [(torch.ones(2), torch.zeros(1))]
    loss = lambda b: F.mse_loss(net(b[0]), b[1])  # noqa: E731
    first = step(batches, loss)
    # the first shrink lost rank 2; this rank's redo of step 1 broke when rank 3 died
    step.membership.lost, step.membership.redo = [2], True
    lead = dataclasses.replace(first, step=1, lost=[2], redone=True)  # the lead completed it

    def regroup(old, mine, rows, sync):  # the census and the lead's sync, one round ahead
        step.rounds.step, step.membership.last = mine + 1, lead
        return old, Census([0], {0: mine + 1}, {0: 0}, [3])

    monkeypatch.setattr(step.shrinker, "regroup", regroup)
    assert step._shrink(PeerFailure("a peer died: drill")) is lead
    after = step(batches, loss)
    assert (after.step, after.lost, after.redone) == (2, [3], True)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("strategy", ["sync", "local-sgd:period=2"])
def test_a_redone_round_moves_the_model_s_buffers_once(alone, monkeypatch, strategy):
    """BatchNorm's statistics move in the forward passes, before any collective: a round that
    breaks in its last collective and is computed again must not move them twice (nor, under
    local steps, the parameters and the optimizer's state)."""
    monkeypatch.setenv("TAILTRAIN_ON_RANK_LOSS", "shrink")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    reference = StragglerStep(net, optimizer, strategy)  # the same rounds, none broken
    step = StragglerStep(net, optimizer, strategy, on_rank_loss="shrink")
    batches = [torch.randn(4, 2, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    loss = lambda b: net(b).square().mean()  # noqa: E731
    start = copy.deepcopy((net.state_dict(), optimizer.state_dict()))
    for _ in range(2):
        reference(batches, loss)
    expected = copy.deepcopy(net.state_dict())
    net.load_state_dict(start[0])
    optimizer.load_state_dict(start[1])
    step(batches, loss)
    timing, broken = step.rounds.timing, []

    def breaks(*args):  # the second round's last collective fails once
        if not broken:
            broken.append(True)
            raise PeerFailure("all_gather failed, a peer may have died: drill")
        return timing(*args)

    def regroup(old, mine, rows, sync):  # nobody completed it: it is computed again
        return old, Census([0], {0: mine}, {0: 0}, [])

    monkeypatch.setattr(step.rounds, "timing", breaks)
    monkeypatch.setattr(step.shrinker, "regroup", regroup)
    record = step(batches, loss)
    assert broken and record.redone and record.step == 1
    for name, value in net.state_dict().items():
        torch.testing.assert_close(value, expected[name], msg=name)


@pytest.mark.slow  # three ranks that each import torch and sklearn, and a learned deadline
@pytest.mark.timeout(300)
def test_a_frozen_rank_is_left_behind_and_told_to_leave_when_it_wakes(tmp_path):
    """Rank 2's training thread freezes inside step 5 (its process alive): the others find it
    silent past the learned deadline, go on as two from step 5 (computed again), and rank 2,
    once it wakes, is told to leave; its late work counts nowhere."""
    script = ROOT / "tests" / "integrate" / "frozen_loop.py"
    command = [
        sys.executable, "-m", "tailtrain", "launch", "--nproc-per-node", "3",
        "--on-rank-loss", "shrink", str(script), "2", "5", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 2 left the job: rank 2 came after the census at step 5" in done.stderr
    assert not (tmp_path / "rank2.pt").exists()
    kept = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    records = kept[0]["records"]
    assert records == kept[1]["records"]
    assert [r["live"] for r in records] == [[0, 1, 2]] * 5 + [[0, 1]] * 11
    assert [(r["step"], r["lost"], r["redone"]) for r in records if r["lost"]] == [(5, [2], True)]
    for name, value in kept[0]["model"].items():
        assert torch.equal(value, kept[1]["model"][name]), name


def rebuilt_dealt(m, records: list[dict], world: int = N) -> dict[str, torch.Tensor]:
    """A reference for a run dealt on demand: G_n the mean gradient over the stream positions
    rank n computed (``record.dealt``)."""
    x, y, _, _ = m.digits()
    stream = m.Stream(x, y, world)
    return replayed(m, records, lambda r, n: [stream[p] for p in r["dealt"][n]])


@pytest.mark.slow  # three ranks importing torch and sklearn, and one of them a fourth time
@pytest.mark.timeout(300)
def test_dealt_on_demand_the_survivors_keep_the_global_batch_and_the_rank_heals(tmp_path):
    """``rebalance:deal=demand``: rank 1 is SIGKILLed inside step 6 and started again. The
    two survivors compute the whole pool of N M stream positions of every step, the broken
    one included (the global batch kept: every position of each step once, none twice), the
    killed rank rejoins at a step boundary with the lead's place in the stream, and every rank
    ends with parameters equal to the reference rebuilt from the positions each computed."""
    _, kept = healed(tmp_path, "--strategy", "rebalance:deal=demand", "--rejoin-steps", "4")
    records = kept[0]["records"]
    assert all(kept[r]["records"] == records for r in range(N) if r != VICTIM)
    back = kept[VICTIM]["records"]
    at = back[0]["step"]
    assert back == records[at:] and len(back) >= 4
    assert [(r["step"], r["lost"], r["redone"]) for r in records if r["lost"]] == [
        (AT, [VICTIM], True)
    ]
    pool = N * example().M
    for r in records:  # the global batch kept: each step's N M positions, once each
        dealt = sorted(p for positions in r["dealt"] for p in positions)
        assert dealt == list(range(r["step"] * pool, (r["step"] + 1) * pool)), r["step"]
        assert sum(r["completed"]) == pool and r["drop_rate"] == 0.0
    shrunk = [r for r in records if len(r["live"]) == N - 1]
    assert shrunk and shrunk[0]["step"] == AT and all(r["step"] < at for r in shrunk)
    models = [kept[r]["model"] for r in range(N)]
    for name, value in models[0].items():
        assert all(torch.equal(value, other[name]) for other in models[1:]), name
    matches_reference(models[0], lambda rows: rebuilt_dealt(example(), rows), records)


@pytest.mark.timeout(30)
def test_a_step_that_cannot_deal_again_refuses_deal_demand_under_shrink(alone, monkeypatch):
    """The refusal names what the step can do: ``ShardedStep`` (``deals_again`` False) does
    not deal a redone round again yet, and a rule of shares is refused by every step."""
    from tailtrain.runtime.elastic.refusals import check_on_rank_loss
    from tailtrain.runtime.reduce import Collectives
    from tailtrain.strategies.registry import parse_strategy

    monkeypatch.setenv("TAILTRAIN_ON_RANK_LOSS", "shrink")
    comm = Collectives.of_group(None, torch.device("cpu"), None)
    demand = parse_strategy("rebalance:deal=demand")
    with pytest.raises(UsageError, match="does not deal 'rebalance:deal=demand' again"):
        check_on_rank_loss("shrink", demand, None, comm, 0.1)
    assert check_on_rank_loss("shrink", demand, None, comm, 0.1, deals_again=True)
    with pytest.raises(UsageError, match="per-rank shares"):
        check_on_rank_loss("shrink", parse_strategy("rebalance"), None, comm, 0.1, deals_again=True)
