"""Mixed precision and clipping in the integration API, on two real gloo ranks: a
``torch.amp.GradScaler`` (the CPU's) under the DDP hook (``on_nonfinite``) and under
``StragglerStep(scaler=)``, against DDP's own scaler loop; ``StragglerStep(max_grad_norm=)``
against SGD on the clipped mean gradient (``integrate_toy``'s model and batches).

An overflow is staged as an infinite loss on the ranks named, as a scale too high for
float16 gives; every decision compared is the scaler's, not a timing.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.integrate.integrate_toy import (
    LR,
    N,
    batch,
    flat,
    grad,
    model,
    optimizer,
    weighted_sgd,
)
from tests.integrate.ranks import join, run_ranks
from torch.nn.parallel import DistributedDataParallel

from tailtrain.errors import UsageError
from tailtrain.integrate import StragglerHookState, StragglerStep, weighted_allreduce_hook


# ---- what each rank runs ------------------------------------------------------------------------
def run_scaled(rank, on_nonfinite, overflow, rounds=3, units=2):
    """A ``torch.amp.GradScaler`` loop (its CPU scaler) over DDP: under the hook (``sync``)
    with ``on_nonfinite``, or, None, DDP's own allreduce. Round 0 overflows on the ranks in
    ``overflow`` (an infinite loss, as a scale too high for float16 gives). Per round: the
    scale after ``update`` and the parameters."""
    ddp = DistributedDataParallel(model())
    state = None
    if on_nonfinite is not None:
        state = StragglerHookState("sync", on_nonfinite=on_nonfinite)
        ddp.register_comm_hook(state, weighted_allreduce_hook)
    opt = optimizer(ddp.parameters(), False)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scales, thetas = [], []
    for r in range(rounds):
        batches = [batch(rank, r, u, units) for u in range(units)]
        if state is None:  # DDP's accumulation: the last micro-batch's backward reduces
            for u, (x, y) in enumerate(batches):
                with ddp.no_sync() if u < units - 1 else contextlib.nullcontext():
                    loss = F.cross_entropy(ddp(x), y) / units
                    loss = loss * math.inf if r == 0 and rank in overflow else loss
                    scaler.scale(loss).backward()
        else:
            for x, y in state.micro_batches(ddp, batches):
                loss = F.cross_entropy(ddp(x), y)
                loss = loss * math.inf if r == 0 and rank in overflow else loss
                scaler.scale(loss).backward()
        if state is None or not state.last.empty:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
        thetas.append(flat(ddp.module))
    return scales, thetas


def run_scaled_step(rank, overflow, rounds=3, units=2):
    """``run_scaled``'s loop on ``StragglerStep(..., scaler=)`` (sync), and each record's
    ``overflowed``."""
    net, scaler = model(), torch.amp.GradScaler("cpu", init_scale=2.0**10)
    step = StragglerStep(net, optimizer(net.parameters(), False), "sync", scaler=scaler)
    scales, thetas, overflowed = [], [], []
    for r in range(rounds):

        def loss_fn(xy, r=r):
            loss = F.cross_entropy(net(xy[0]), xy[1])
            return loss * math.inf if r == 0 and rank in overflow else loss

        record = step([batch(rank, r, u, units) for u in range(units)], loss_fn)
        scales.append(scaler.get_scale())
        thetas.append(flat(net))
        overflowed.append(record.overflowed)
    return scales, thetas, overflowed


def run_disabled_scaler(rank):
    """``GradScaler(enabled=False)`` (``enabled=use_amp``): it scales nothing, so the screen
    stays; rank 1's NaN in round 0 is screened out as without a scaler."""
    net = model()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    step = StragglerStep(net, optimizer(net.parameters(), False), "sync", scaler=scaler)

    def loss_fn(xy):
        loss = F.cross_entropy(net(xy[0]), xy[1])
        return loss * math.nan if rank == 1 else loss

    record = step([batch(rank, 0, u, 2) for u in range(2)], loss_fn)
    return flat(net), [record.as_dict()], None


#: a total norm the digits-free toy's mean gradients exceed, so the clip acts every round
CLIP = 0.05


def run_clipped(rank, scaled: bool, rounds=3, units=2):
    """``StragglerStep(..., max_grad_norm=CLIP)`` (sync), with or without a GradScaler."""
    net = model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if scaled else None
    step = StragglerStep(
        net, optimizer(net.parameters(), False), "sync", scaler=scaler, max_grad_norm=CLIP
    )
    for r in range(rounds):
        step([batch(rank, r, u, units) for u in range(units)], lambda xy: grad_loss(net, xy))
    return flat(net)


def grad_loss(net, xy):
    return F.cross_entropy(net(xy[0]), xy[1])


def scaler_refused() -> str:
    try:
        StragglerStep(model(), optimizer(model().parameters(), False), "local-sgd:period=2",
                      scaler=torch.amp.GradScaler("cpu"))  # fmt: skip
    except UsageError as exc:
        return str(exc)
    return ""


def rank_main(rank: int, port: int, folder: str) -> None:
    join(rank, port, N)
    out = {
        "scaled": {
            f"{mode}-{'-'.join(map(str, over))}": run_scaled(rank, on_nonfinite, over)
            for mode, on_nonfinite in (("ddp", None), ("propagate", "propagate"), ("skip", "skip"))
            for over in ((1,), (0, 1))
        }
        | {f"step-{'-'.join(map(str, o))}": run_scaled_step(rank, o) for o in ((1,), (0, 1))},
        "scaler-refused": scaler_refused(),
        "scaler-disabled": run_disabled_scaler(rank),
        "clipped": {"plain": run_clipped(rank, False), "scaled": run_clipped(rank, True)},
    }
    torch.save(out, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixed_precision")
    return run_ranks(rank_main, folder, N)


# ---- tests ----------------------------------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("over", ["1", "0-1"])
def test_an_overflow_propagated_reaches_the_grad_scaler_as_under_ddp(results, over):
    """``on_nonfinite="propagate"`` and ``StragglerStep(..., scaler=)``: one rank's overflow or
    every rank's, the scaler skips the step on every rank and halves its scale, then steps as
    DDP's does. Screened out (the
    default), the scale never comes down and the overflowing ranks leave the update."""
    for rank in results:
        ddp_scales, ddp_thetas = rank["scaled"][f"ddp-{over}"]
        scales, thetas = rank["scaled"][f"propagate-{over}"]
        assert scales == ddp_scales == [2.0**9, 2.0**9, 2.0**9]
        torch.testing.assert_close(thetas[0], flat(model()))  # round 0 skipped
        for mine, theirs in zip(thetas, ddp_thetas, strict=True):
            torch.testing.assert_close(mine, theirs)
        step_scales, step_thetas, overflowed = rank["scaled"][f"step-{over}"]  # its scaler
        assert step_scales == ddp_scales
        assert overflowed == [True, False, False]  # the record says which step it skipped
        for mine, theirs in zip(step_thetas, ddp_thetas, strict=True):
            torch.testing.assert_close(mine, theirs)
        skip_scales, skip_thetas = rank["scaled"][f"skip-{over}"]
        assert skip_scales[0] == 2.0**10  # the scaler saw no overflow
        if over == "1":  # rank 0's gradient alone entered round 0
            assert not torch.equal(skip_thetas[0], flat(model()))


def clipped_sgd(rounds: int, units: int) -> torch.Tensor:
    """SGD on the mean gradient of every rank's micro-batches, clipped to total norm CLIP."""
    net = model()
    for r in range(rounds):
        step = [torch.zeros_like(p) for p in net.parameters()]
        for n in range(N):
            for u in range(units):
                for s, g in zip(step, grad(net, batch(n, r, u, units)), strict=True):
                    s += g / (units * N)
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(s) for s in step]))
        assert norm > CLIP  # the clip acts
        with torch.no_grad():
            for p, s in zip(net.parameters(), step, strict=True):
                p -= LR * s * (CLIP / norm)
    return flat(net)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["plain", "scaled"])
def test_max_grad_norm_clips_the_mean_gradient_unscaled(results, case):
    expected = clipped_sgd(3, 2)
    for rank in results:
        torch.testing.assert_close(rank["clipped"][case], expected)


def test_a_bad_max_grad_norm_is_refused_in_one_line():
    net = model()
    with pytest.raises(UsageError, match="max_grad_norm must be a finite norm > 0, got 0"):
        StragglerStep(net, optimizer(net.parameters(), False), "sync", max_grad_norm=0)


def test_a_scaler_with_local_steps_is_refused_in_one_line(results):
    assert "GradScaler" in results[0]["scaler-refused"]
    assert "\n" not in results[0]["scaler-refused"]


@pytest.mark.timeout(300)
def test_a_disabled_scaler_keeps_the_screen(results):
    """``GradScaler(enabled=False)`` (``enabled=use_amp``): rank 1's NaN is screened out, as
    without a scaler."""
    expected = weighted_sgd(1, 2, [2, 0], ranks=[0])
    for theta, records, _ in (r["scaler-disabled"] for r in results):
        torch.testing.assert_close(theta, expected)
        assert records[0]["nonfinite"] == 1 and records[0]["weights"] == [1.0, 0.0]
