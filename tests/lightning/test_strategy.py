"""tailtrain.lightning.StragglerStrategy with the real Lightning on two gloo ranks (CPU).

One torchrun job (tests/lightning/strategy_job.py) trains a tiny LightningModule four times
with ``accumulate_grad_batches=4`` and saves, per optimizer step and rank, the parameters,
the micro-batches' sample indices and the step's record. Rank 1 sleeps 40 ms in every
micro-batch of the ``auto`` run, against about a millisecond of compute, so Algorithm 2's tau
cuts its micro-batches whatever the machine's speed. The tests compare the runs with
references written from the definitions: SGD with momentum on sum_n w_n G_n, G_n the mean
gradient of rank n's counted micro-batches (DropCompute Eq. (1), as
tests/integrate/test_shrink_step.py's ``rebuilt``), and Lightning's own DDP.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

import torch
import torch.nn.functional as F
from tests.integrate.ranks import free_port
from tests.lightning import strategy_job as job

from tailtrain.errors import UsageError
from tailtrain.lightning.strategy import CHECKPOINT_KEY, StragglerStrategy

ROOT = Path(__file__).resolve().parents[2]
#: gloo sums in its own order; one step less is far outside (checked below)
CLOSE = {"rtol": 1e-3, "atol": 1e-5}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lightning_strategy")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(job.N),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        str(ROOT / "tests" / "lightning" / "strategy_job.py"), str(folder),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(job.N)]
    return ranks, folder


def rebuilt(steps_by_rank: list[list[dict]]) -> list[torch.Tensor]:
    """Per step, the parameters of SGD with momentum on sum_n w_n G_n, G_n the mean gradient
    of the first ``completed[n]`` micro-batches rank n was given in that step."""
    net = job.make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=job.LR, momentum=job.MOMENTUM)
    out = []
    for at, step in enumerate(steps_by_rank[0]):
        record = step["record"]
        total = [torch.zeros_like(p) for p in net.parameters()]
        for n in record["ranks"]:
            rank, weight = record["live"][n], record["weights"][n]
            counted = steps_by_rank[rank][at]["batches"][: record["completed"][n]]
            for idx in counted:
                net.zero_grad()
                F.cross_entropy(net(job.X[idx]), job.Y[idx]).backward()
                for t, p in zip(total, net.parameters(), strict=True):
                    t.add_(p.grad, alpha=weight / len(counted))
        if not record["empty"]:
            for p, t in zip(net.parameters(), total, strict=True):
                p.grad = t
            optimizer.step()
        out.append(job.flat(net))
    return out


def steps(ranks, *names: str) -> list[list[dict]]:
    """Each rank's steps of the runs ``names``, one after the other."""
    return [[s for name in names for s in rank[name]["steps"]] for rank in ranks]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("run", ["auto", "resume", "ddp", "inf", "shares"])
def test_every_step_leaves_the_same_parameters_on_both_ranks(runs, run):
    ranks, _ = runs
    expected = {"resume": job.RESUMED}.get(run, job.STEPS)
    assert len(ranks[0][run]["steps"]) == len(ranks[1][run]["steps"]) == expected
    for a, b in zip(ranks[0][run]["steps"], ranks[1][run]["steps"], strict=True):
        torch.testing.assert_close(a["params"], b["params"], rtol=0, atol=0)


@pytest.mark.timeout(300)
def test_the_threshold_cuts_the_slow_rank_and_the_update_is_the_rebuilt_eq_1(runs):
    ranks, _ = runs
    records = [s["record"] for s in ranks[0]["auto"]["steps"]]
    assert [r["step"] for r in records] == list(range(job.STEPS))
    assert all(r == s["record"] for r, s in zip(records, ranks[1]["auto"]["steps"], strict=True))
    cut = [r for r in records if r["completed"][job.SLOW_RANK] < job.ACCUMULATE]
    assert cut and all(r["threshold"] < 1.0 for r in cut), records  # the test proves something
    assert all(r["drop_rate"] > 0 for r in cut)
    reference = rebuilt(steps(ranks, "auto"))
    for step, expected in zip(ranks[0]["auto"]["steps"], reference, strict=True):
        torch.testing.assert_close(step["params"], expected, **CLOSE)
    # the check can fail: the same steps with every micro-batch counted are elsewhere
    every = {"completed": [job.ACCUMULATE] * job.N, "weights": [1 / job.N] * job.N}
    every["ranks"] = list(range(job.N))
    full = [
        [{**s, "record": {**s["record"], **every}} for s in rank] for rank in steps(ranks, "auto")
    ]
    uncut = rebuilt(full)[-1]
    assert not torch.allclose(ranks[0]["auto"]["steps"][-1]["params"], uncut, **CLOSE)


@pytest.mark.timeout(300)
def test_the_comm_hook_runs_on_cpu_once_per_bucket_and_step(runs):
    ranks, _ = runs
    for rank in ranks:
        for run in ("auto", "resume", "inf"):
            reduced, taken = rank[run]["buckets_reduced"], len(rank[run]["steps"])
            assert reduced >= taken > 0 and reduced % taken == 0, (run, reduced, taken)


@pytest.mark.timeout(300)
def test_threshold_inf_without_a_straggler_is_plain_lightning_ddp(runs):
    ranks, _ = runs
    for rank in ranks:
        for ours, plain in zip(rank["inf"]["steps"], rank["ddp"]["steps"], strict=True):
            assert ours["batches"] == plain["batches"]
            assert ours["record"]["completed"] == [job.ACCUMULATE] * job.N
            torch.testing.assert_close(ours["params"], plain["params"], rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(300)
def test_under_16_mixed_an_overflow_reaches_the_grad_scaler_as_under_lightnings_ddp(runs):
    """The hook propagates a non-finite bucket where the precision scales the loss: rank 1's
    overflow in the first step makes both ranks' scalers skip it and halve their scale, and
    every later step is Lightning's DDP's (screened out, the scale would stay)."""
    ranks, _ = runs
    for rank in ranks:
        ours, plain = rank["scaled"], rank["scaled-ddp"]
        assert ours["on_nonfinite"] == "propagate" and rank["inf"]["on_nonfinite"] == "skip"
        assert ours["scale"] == plain["scale"] == job.SCALE / 2
        torch.testing.assert_close(ours["steps"][0]["params"], ours["initial"])
        assert len(ours["steps"]) == len(plain["steps"]) == job.STEPS
        for mine, theirs in zip(ours["steps"], plain["steps"], strict=True):
            torch.testing.assert_close(mine["params"], theirs["params"], rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(300)
def test_a_checkpoint_carries_the_rule_state_and_resuming_continues_its_rounds(runs):
    ranks, folder = runs
    saved = torch.load(folder / "auto.ckpt", weights_only=False)
    assert saved[CHECKPOINT_KEY] == ranks[0]["auto"]["state"]
    first = ranks[0]["resume"]["steps"][0]["record"]
    last = ranks[0]["auto"]["steps"][-1]["record"]
    assert first["step"] == last["step"] + 1 and first["threshold"] == last["threshold"]
    reference = rebuilt(steps(ranks, "auto", "resume"))[job.STEPS :]
    for step, expected in zip(ranks[0]["resume"]["steps"], reference, strict=True):
        torch.testing.assert_close(step["params"], expected, **CLOSE)


@pytest.mark.timeout(300)
def test_the_decisions_reach_the_trainers_loggers(runs):
    ranks, _ = runs
    for rank in ranks:
        logged, steps = rank["auto"]["metrics"], rank["auto"]["steps"]
        assert len(logged) == len(steps)  # log_every_n_steps=1
        for (at, metrics), step in zip(logged, steps, strict=True):
            record = step["record"]
            assert at == record["step"]  # the trainer's global step, 0 at the first
            assert metrics["tailtrain/drop_rate"] == pytest.approx(record["drop_rate"])
            assert metrics["tailtrain/threshold"] == pytest.approx(record["threshold"])
            done = [metrics[f"tailtrain/completed/{n}"] for n in range(job.N)]
            assert done == record["completed"]


def global_batch_sgd(ranks, weights: list[float] | None = None) -> list[torch.Tensor]:
    """Per step, SGD with momentum on the mean gradient over every rank's samples of the step
    (the global batch); with ``weights``, on sum_n weights[n] (rank n's mean gradient)."""
    net = job.make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=job.LR, momentum=job.MOMENTUM)
    out = []
    for at in range(len(ranks[0]["shares"]["steps"])):
        mine = [[i for b in rank["shares"]["steps"][at]["batches"] for i in b] for rank in ranks]
        net.zero_grad()
        if weights is None:
            every = [i for idx in mine for i in idx]
            F.cross_entropy(net(job.X[every]), job.Y[every]).backward()
        else:
            for w, idx in zip(weights, mine, strict=True):
                (w * F.cross_entropy(net(job.X[idx]), job.Y[idx])).backward()
        optimizer.step()
        out.append(job.flat(net))
    return out


@pytest.mark.timeout(300)
def test_shares_deal_each_rank_its_batch_and_the_update_is_the_global_batch_mean(runs):
    ranks, _ = runs
    for r, rank in enumerate(ranks):
        for step in rank["shares"]["steps"]:
            assert [len(b) for b in step["batches"]] == [job.SHARES[r]] * job.ACCUMULATE
    seen = [i for rank in ranks for s in rank["shares"]["steps"] for b in s["batches"] for i in b]
    assert len(seen) == len(set(seen)) == job.SAMPLES  # every sample once an epoch
    for step, expected in zip(ranks[0]["shares"]["steps"], global_batch_sgd(ranks), strict=True):
        torch.testing.assert_close(step["params"], expected, **CLOSE)
    # DDP's own mean of the ranks' gradients (1/N each) is elsewhere: the hook weighed
    plain = global_batch_sgd(ranks, [1 / job.N] * job.N)[-1]
    assert not torch.allclose(ranks[0]["shares"]["steps"][-1]["params"], plain, **CLOSE)


# ---- refusals: one line, before any process starts ----------------------------------------
@pytest.mark.parametrize(
    ("spec", "kwargs", "says"),
    [
        ("local-sgd:period=2", {}, "averages models every 2 local steps"),
        ("k-sync:k=1", {}, "needs the parameter-server topology"),
        ("rebalance", {}, "give shares=[b_0, ..., b_N-1]"),
        ("dropcompute", {"shares": [1, 1]}, "rebalance_loader runs rebalance only"),
        ("dropcompute", {"ddp_comm_hook": print}, "drop ddp_comm_hook="),
        ("dropcompute:threshold=often", {}, "threshold"),
    ],
)
def test_what_lightning_cannot_run_is_refused_in_one_line(spec, kwargs, says):
    with pytest.raises(UsageError) as refused:
        StragglerStrategy(spec, **kwargs)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_shrinking_launch_is_refused(monkeypatch):
    monkeypatch.setenv("TAILTRAIN_ON_RANK_LOSS", "shrink")
    with pytest.raises(UsageError, match="does not shrink"):
        StragglerStrategy("dropcompute:threshold=auto")


def test_manual_optimization_is_refused_at_fit():
    class Manual(job.Tiny):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

    strategy = StragglerStrategy("dropcompute:threshold=auto")
    strategy._lightning_module = Manual()
    with pytest.raises(UsageError, match="automatic optimization"):
        strategy.setup(None)
