"""The integration API on two real gloo ranks: StragglerStep and the DDP comm hook.

One forked job of two ranks runs every case in turn and saves its results; the tests compare
them with references written from the definitions: SGD on the concatenated mini-batches,
DropCompute Eq. (1) (each rank's mean over its counted micro-batches, weighted C_n/M over N)
and Local-SGD's average of local models. Drops are forced by a 1 s sleep against tau = 0.5 s
(the other units take milliseconds), so the decisions do not depend on the machine's speed.
"""

from __future__ import annotations

import math
import pickle
import time

import numpy as np
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

from tailtrain.errors import TailtrainError, UsageError
from tailtrain.integrate import StragglerHookState, StragglerStep, weighted_allreduce_hook
from tailtrain.strategies.registry import parse_strategy

TAU, SLOW = 0.5, 1.0
DROP = f"dropcompute:threshold={TAU},stop=between"
#: a threshold every rank passes before its first micro-batch can start
NOTHING = "dropcompute:threshold=1e-9"
#: weights C_n / sum_k C_k: a rank that computed nothing divides by 1 alone, by the sum among all
COMPUTED = "dropcompute:threshold=inf,divide-by=computed"
#: rank 0 computes 1 of its 3 micro-batches, rank 1 none
IDLE = {0: 1, 1: 0}
#: the model dtypes the collective counts run: rows ride in float32; half precisions gather
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ---- what each rank runs ------------------------------------------------------------------------
def run_step(rank, strategy, rounds, units, slow=False, nan_at=None, decay=False, dtype=None):
    net = model() if dtype is None else model().to(dtype)
    step = StragglerStep(net, optimizer(net.parameters(), decay), strategy)

    def loss_fn(xy):
        loss = F.cross_entropy(net(xy[0] if dtype is None else xy[0].to(dtype)), xy[1])
        if slow and rank == 1 and xy[0] is first[0]:
            time.sleep(SLOW)
        return loss * math.nan if nan_at == (rank, len(records)) else loss

    records = []
    for r in range(rounds):
        batches = [batch(rank, r, u, units) for u in range(units)]
        first = batches[0]
        records.append(step(batches, loss_fn).as_dict())
    return flat(net), records, step.state_dict()


def run_ddp(
    rank, strategy, rounds, units, decay=False, slow=True, nan_at=None, dtype=None, cut=None
):
    """The DDP hook's loop; ``cut``: rank -> the micro-batches its threshold admits a round
    (the rest are refused, whatever the clock says)."""
    net = model() if dtype is None else model().to(dtype)
    ddp = DistributedDataParallel(net)
    state = StragglerHookState(strategy)
    ddp.register_comm_hook(state, weighted_allreduce_hook)
    if cut is not None and rank in cut:
        admit = state.rounds.admit

        def admit_at_most(work, plan):
            if int((~np.isnan(work.times)).sum()) < cut[rank]:
                return admit(work, plan)
            state.rounds.stop(work)
            return False

        state.rounds.admit = admit_at_most
    opt = optimizer(ddp.parameters(), decay)
    records = []
    for r in range(rounds):
        for u, (x, y) in enumerate(
            state.micro_batches(ddp, [batch(rank, r, u, units) for u in range(units)])
        ):
            if slow and rank == 1 and u == 0:
                time.sleep(SLOW)
            loss = F.cross_entropy(ddp(x if dtype is None else x.to(dtype)), y)
            (loss * math.nan if nan_at == (rank, r) else loss).backward()
        if not state.last.empty:  # as ``StragglerStep`` does for itself
            opt.step()
        opt.zero_grad()
        records.append(state.last.as_dict())
    return flat(ddp.module), records, pickle.loads(pickle.dumps(state)).state_dict()


def refused(strategy) -> str:
    try:
        StragglerHookState(strategy).micro_batches(None, [1, 2]).__next__()
    except UsageError as exc:
        return str(exc)
    return ""


def own_weight_refused(rank) -> str:
    """A rule whose weight among all ranks is not the one a rank reduced with alone: the
    hook's check after the buckets (both ranks raise there, before any optimizer step)."""
    from tailtrain.runtime.control import OwnWeight

    ddp = DistributedDataParallel(model())
    state = StragglerHookState("sync")
    ddp.register_comm_hook(state, weighted_allreduce_hook)
    own = state.rounds.own
    state.rounds.own = lambda work, plan=None: OwnWeight(2 * own(work, plan).weight, None)
    try:
        for x, y in state.micro_batches(ddp, [batch(rank, 0, u, 2) for u in range(2)]):
            F.cross_entropy(ddp(x), y).backward()
    except TailtrainError as exc:
        return str(exc)
    return ""


def count_collectives(rank, dtype, rounds=2, units=2, hook=False):
    """The gathers and weighted allreduces of ``rounds`` sync calls on a ``dtype`` model,
    counted on this rank, and its parameters after them; ``hook``: the DDP comm hook's calls,
    whose buckets' allreduces are its own (``dist.all_reduce``): their sizes instead."""
    from tailtrain.runtime.reduce import Collectives

    counts = {"gather": 0, "weighted_sum": 0}
    kept = {name: getattr(Collectives, name) for name in counts}

    def counting(name):
        def call(self, *args, **kwargs):
            counts[name] += 1
            return kept[name](self, *args, **kwargs)

        return call

    all_reduce, sizes = dist.all_reduce, []

    def sized(tensor, *args, **kwargs):
        sizes.append(tensor.numel())
        return all_reduce(tensor, *args, **kwargs)

    try:
        for name in counts:
            setattr(Collectives, name, counting(name))
        if hook:
            dist.all_reduce = sized
            theta, _, _ = run_ddp(rank, "sync", rounds, units, slow=False, dtype=dtype)
            return {**counts, "all_reduce_sizes": sizes}, theta.float()
        net = model().to(dtype)
        step = StragglerStep(net, optimizer(net.parameters(), False), "sync")
        for r in range(rounds):
            batches = [
                (x.to(dtype), y) for x, y in (batch(rank, r, u, units) for u in range(units))
            ]
            step(batches, lambda xy: F.cross_entropy(net(xy[0]), xy[1]))
    finally:
        dist.all_reduce = all_reduce
        for name, method in kept.items():
            setattr(Collectives, name, method)
    return counts, flat(net).float()


def gathered_first(rank):
    """The merged cases again with the agreement gathered before the allreduce (the
    half-precision path, forced on float32): the two protocols' results, to compare."""
    from tailtrain.integrate import average as step_module

    kept = step_module.ROW_DTYPES
    step_module.ROW_DTYPES = ()
    try:
        return {
            "sync": run_step(rank, "sync", 3, 2),
            "local-sgd": run_step(rank, "local-sgd:period=2", 2, 2),
            "nan": run_step(rank, "sync", 1, 2, nan_at=(1, 0)),
            "empty": run_step(rank, NOTHING, 2, 2, decay=True),
            "ddp-sync": run_ddp(rank, "sync", 3, 2, slow=False),
            "ddp-drop": run_ddp(rank, DROP, 2, 3),
            "ddp-nan": run_ddp(rank, "sync", 1, 2, slow=False, nan_at=(1, 0)),
            "ddp-empty": run_ddp(rank, NOTHING, 2, 2, decay=True),
            "ddp-idle": run_ddp(rank, COMPUTED, 2, 3, slow=False, cut=IDLE),
        }
    finally:
        step_module.ROW_DTYPES = kept


def rank_main(rank: int, port: int, folder: str) -> None:
    join(rank, port, N)
    out = {
        "sync": run_step(rank, "sync", 3, 2),
        "drop": run_step(rank, DROP, 2, 3, slow=True),
        "ddp-drop": run_ddp(rank, DROP, 2, 3),
        "local-sgd": run_step(rank, "local-sgd:period=2", 2, 2),
        "auto": run_step(rank, "dropcompute:calibrate=2", 4, 2),
        "nan": run_step(rank, "sync", 1, 2, nan_at=(1, 0)),
        "empty": run_step(rank, NOTHING, 2, 2, decay=True),
        "ddp-empty": run_ddp(rank, NOTHING, 2, 2, decay=True),
        "ddp-sync": run_ddp(rank, "sync", 3, 2, slow=False),
        "ddp-nan": run_ddp(rank, "sync", 1, 2, slow=False, nan_at=(1, 0)),
        "ddp-idle": run_ddp(rank, COMPUTED, 2, 3, slow=False, cut=IDLE),
        "ddp-own-weight": own_weight_refused(rank),
        "half-drop": {
            "step": run_step(rank, DROP, 1, 3, slow=True, dtype=torch.bfloat16),
            "ddp": run_ddp(rank, DROP, 1, 3, dtype=torch.bfloat16),
        },
        "refused": refused("local-sgd:period=2"),
        "gathered-first": gathered_first(rank),
        "collectives": {str(t): count_collectives(rank, t) for t in DTYPES},
        "hook-collectives": {str(t): count_collectives(rank, t, hook=True) for t in DTYPES},
    }
    torch.save(out, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("integrate")
    return run_ranks(rank_main, folder, N)


# ---- independent references (beside integrate_toy's) -----------------------------------------
def local_sgd(rounds: int, period: int) -> torch.Tensor:
    theta = model()
    for r in range(rounds):
        local = []
        for n in range(N):
            net = model()
            net.load_state_dict(theta.state_dict())
            for h in range(period):
                grads = grad(net, batch(n, r, h, period))
                with torch.no_grad():
                    for p, g in zip(net.parameters(), grads, strict=True):
                        p -= LR * g
            local.append(flat(net))
        torch.nn.utils.vector_to_parameters(torch.stack(local).mean(0), theta.parameters())
    return flat(theta)


# ---- tests ----------------------------------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["sync", "ddp-sync"])
def test_sync_is_sgd_on_the_concatenated_batches(results, case):
    expected = weighted_sgd(3, 2, [2, 2])
    for theta, records, _ in (r[case] for r in results):
        torch.testing.assert_close(theta, expected)
        assert [rec["completed"] for rec in records] == [[2, 2]] * 3


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["drop", "ddp-drop"])
def test_a_dropped_micro_batch_leaves_the_average_of_eq_1(results, case):
    expected = weighted_sgd(2, 3, [3, 1])
    for theta, records, _ in (r[case] for r in results):
        torch.testing.assert_close(theta, expected)
        for rec in records:
            assert rec["completed"] == [3, 1] and rec["ranks"] == [0, 1]
            np.testing.assert_allclose(rec["weights"], [1 / 2, 1 / 6])
            assert rec["threshold"] == TAU and rec["drop_rate"] == pytest.approx(1 / 3)


@pytest.mark.timeout(300)
def test_local_sgd_averages_the_local_models(results):
    expected = local_sgd(2, 2)
    for theta, _, _ in (r["local-sgd"] for r in results):
        torch.testing.assert_close(theta, expected)


@pytest.mark.timeout(300)
def test_every_rank_computes_the_same_tau_star_and_checkpoints_it(results):
    thresholds = [[rec["threshold"] for rec in r["auto"][1]] for r in results]
    assert thresholds[0] == thresholds[1]
    assert all(math.isinf(t) for t in thresholds[0][:2])
    assert 0 < thresholds[0][2] == thresholds[0][3] < math.inf
    state = results[0]["auto"][2]
    rule = parse_strategy("dropcompute:calibrate=2").load_state_dict(state["rule"])
    assert state["step"] == 4 and rule.tau == thresholds[0][3]


@pytest.mark.timeout(300)
def test_states_reload_without_pickle_and_without_the_process_group(results, tmp_path):
    state = results[0]["auto"][2]
    torch.save(state, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert loaded == state
    assert results[0]["ddp-drop"][2]["step"] == 2  # the hook state survived pickling


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["nan", "ddp-nan"])
def test_a_non_finite_gradient_joins_with_weight_zero(results, case):
    expected = weighted_sgd(1, 2, [2, 0], ranks=[0])
    for theta, records, _ in (r[case] for r in results):
        torch.testing.assert_close(theta, expected)
        assert records[0]["nonfinite"] == 1
        assert records[0]["ranks"] == [0] and records[0]["weights"] == [1.0, 0.0]


def test_a_hook_state_refuses_an_unknown_on_nonfinite_in_one_line():
    with pytest.raises(UsageError, match="on_nonfinite must be one of skip, propagate"):
        StragglerHookState("sync", on_nonfinite="raise")


def test_local_sgd_has_no_comm_hook(results):
    assert "local steps" in results[0]["refused"]


def test_a_parameter_server_strategy_is_refused_in_one_line():
    with pytest.raises(UsageError, match="allreduce strategies") as err:
        StragglerStep(model(), torch.optim.SGD(model().parameters(), lr=LR), "k-sync:k=1")
    assert "\n" not in str(err.value)


def test_a_sync_with_a_parameter_server_mode_is_refused_in_one_line():
    """``sync:mode=pull`` runs on the parameter server (its rule declares so, as
    ``Strategy.topology``);
    a loop would ignore its mode, so it is refused."""
    with pytest.raises(UsageError, match="parameter-server topology") as err:
        StragglerStep(model(), torch.optim.SGD(model().parameters(), lr=LR), "sync:mode=pull")
    assert "\n" not in str(err.value)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["empty", "ddp-empty"])
def test_a_round_that_ran_nothing_leaves_the_parameters(results, case):
    """Every rank stops before its first micro-batch: the record says the round was empty and
    measured no loss, and the parameters are the initial ones although the optimizer has
    momentum and weight decay, which a zero-gradient step would apply."""
    for theta, records, _ in (out[case] for out in results):
        torch.testing.assert_close(theta, flat(model()), rtol=0, atol=0)
        for record in records:
            assert record["empty"] and record["completed"] == [0] * N and record["ranks"] == []
            assert math.isnan(record["loss"])
    # a round that ran something is not empty
    assert not any(r["empty"] for out in results for r in out["drop"][1])


def test_a_call_carries_its_agreement_in_the_allreduce_and_gathers_only_its_timing(results):
    """One collective fewer a step than a gather first (``integrate.average.agreed_average``),
    as ``train``'s round: a float32 model's call runs its weighted allreduce (the agreement's
    rows riding in it) and the closing gather; a float16 or bfloat16 model's gradients cannot
    carry the rows exactly, so its agreement is gathered apart (a bfloat16 buffer staged past
    numpy, which has no such dtype), and each gives one model on every rank."""
    for rank in range(N):
        counts, _ = results[rank]["collectives"]["torch.float32"]
        assert counts == {"gather": 2, "weighted_sum": 2}  # 2 calls: 1 + 1 each
        for half in ("torch.float16", "torch.bfloat16"):
            counts, _ = results[rank]["collectives"][half]
            assert counts == {"gather": 4, "weighted_sum": 2}
    for dtype in map(str, DTYPES):
        assert torch.equal(results[0]["collectives"][dtype][1], results[1]["collectives"][dtype][1])


def test_the_ddp_hooks_first_bucket_carries_the_agreement_and_only_the_timing_is_gathered(
    results,
):
    """The DDP comm hook's round as StragglerStep's: a float32 model's agreement rides in its
    first bucket's allreduce, so a call gathers only its timing; a float16 or bfloat16 model's
    buckets cannot carry the rows exactly, so its agreement is gathered first; one model on every
    rank either way."""
    params = sum(p.numel() for p in model().parameters())  # one bucket
    tail, row = 2, 3 + 2  # [w_n, withheld]; [C_n, T~_n, loss sum, t^(1..U)], U = 2
    for rank in range(N):
        counts, _ = results[rank]["hook-collectives"]["torch.float32"]
        assert counts == {  # 2 calls: the closing gather each, the rows in the bucket
            "gather": 2, "weighted_sum": 0, "all_reduce_sizes": [params + tail + N * row] * 2,
        }  # fmt: skip
        for half in ("torch.float16", "torch.bfloat16"):
            counts, _ = results[rank]["hook-collectives"][half]
            assert counts == {
                "gather": 4, "weighted_sum": 0, "all_reduce_sizes": [params + tail] * 2,
            }  # fmt: skip
    for dtype in map(str, DTYPES):
        first, second = (results[r]["hook-collectives"][dtype][1] for r in range(N))
        assert torch.equal(first, second)


def test_a_hook_rank_that_computed_nothing_divides_as_the_selection_over_every_rank(results):
    """DropCompute divide-by=computed: rank 1 computed nothing, so its own arrival alone fixes
    a divisor of 1, while the selection over both ranks divides by the weights' sum (1/3:
    rank 0 computed 1 of 3). Its buckets, divided before the selection was known, are
    rescaled: both ranks step by rank 0's one gradient, the same model."""
    net = model()
    for r in range(2):  # SGD on rank 0's first micro-batch of each round
        grads = grad(net, batch(0, r, 0, 3))
        with torch.no_grad():
            for p, g in zip(net.parameters(), grads, strict=True):
                p -= LR * g
    for theta, records, _ in (r["ddp-idle"] for r in results):
        torch.testing.assert_close(theta, flat(net))
        for record in records:
            assert record["completed"] == [1, 0] and record["weights"] == [1.0, 0.0]


@pytest.mark.parametrize("entry", ["step", "ddp"])
def test_a_bfloat16_model_cut_to_non_dyadic_weights_still_agrees(results, entry):
    """Weights 1/2 and 1/6 summed in bfloat16 are off their total by more than float32's
    tolerance; the check allows the dtype's rounding, and both ranks hold one model."""
    thetas = [out["half-drop"][entry][0] for out in results]
    assert torch.equal(thetas[0], thetas[1])
    for out in results:
        (record,) = out["half-drop"][entry][1]
        assert record["completed"] == [3, 1]
        np.testing.assert_allclose(record["weights"], [1 / 2, 1 / 6])


def test_a_hook_rank_weighed_otherwise_than_alone_is_refused_before_its_step(results):
    for out in results:
        assert "the one-allreduce protocol needs weights" in out["ddp-own-weight"]


@pytest.mark.parametrize(
    "case",
    [
        *("sync", "local-sgd", "nan", "empty"),
        *("ddp-sync", "ddp-drop", "ddp-nan", "ddp-empty", "ddp-idle"),
    ],
)
def test_the_agreement_in_the_allreduce_decides_as_the_gather_before_it(results, case):
    """The merged protocol against the agreement gathered first, on the same calls: the same
    parameters, counts and weights (the rows ride in float32 there, so the loss to 1e-6)."""
    for rank in range(N):
        merged, records, _ = results[rank][case]
        first, before, _ = results[rank]["gathered-first"][case]
        torch.testing.assert_close(merged, first, rtol=1e-6, atol=1e-7)
        for got, want in zip(records, before, strict=True):
            assert (got["completed"], got["weights"], got["ranks"], got["empty"]) == (
                want["completed"], want["weights"], want["ranks"], want["empty"],
            )  # fmt: skip
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-6, nan_ok=True)
