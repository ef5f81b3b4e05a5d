"""The probe on two real gloo ranks: it changes no parameter, and its trace and verdicts agree
with a delay injected on rank 1 (a 40 ms sleep in every forward; the model computes in well
under a millisecond), in a DDP job and in a loop with its own allreduce; the ranks agree on
when to gather by its default cadence in seconds (a run at ``INTERVAL_S``)."""

from __future__ import annotations

import gc
import time
import weakref

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.integrate.ranks import join, run_ranks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tailtrain.core.machine import read_machine
from tailtrain.delays import parse_delay
from tailtrain.delays.trace import read_trace
from tailtrain.integrate import StragglerProbe
from tailtrain.integrate.probe import (
    LIVE_MIN_STEPS,
    MAX_WINDOW,
    SAMPLES,
    ProbeReport,
    window_steps,
)
from tailtrain.persistence import classify_workers

N, STEPS, SLOW, LR = 2, 24, 0.04, 0.1
INTERVAL_S = 0.3  #: the cadence-in-seconds run: windows of about 7 steps of 40 ms
X = torch.randn(STEPS * N * 8, 6, generator=torch.Generator().manual_seed(0))
Y = torch.randn(STEPS * N * 8, 2, generator=torch.Generator().manual_seed(1))


#: DDP's options the probe must time alike (``accumulate``: every other micro-batch in
#: ``no_sync()``; ``spare``: a parameter forward never uses; ``buffers``: a model with a
#: buffer, which DDP broadcasts from rank 0 at each forward, rank 1 slow before its forward
#: instead of in it, so rank 0 waits in that broadcast, not in the reduction)
VARIANTS = {
    "find_unused": {"find_unused_parameters": True, "spare": True},
    "static_graph": {"static_graph": True},
    "bucket_view": {"gradient_as_bucket_view": True},
    "no_sync": {"accumulate": True},
    "buffers": {"buffers": True},
}


class Slow(nn.Module):
    def __init__(self, delay: float, spare: bool = False, buffers: bool = False) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
        self.spare = nn.Linear(2, 2) if spare else None
        self.delay = delay
        if buffers:
            self.register_buffer("scale", torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return self.net(x)


def loader(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(X[i : i + 8], Y[i : i + 8]) for i in range(rank * 8, len(X), N * 8)]


def flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def run_ddp(
    rank: int, folder: str | None, variant: str | None = None, cadence: dict | None = None
) -> dict:
    """The DDP loop, with the probe where ``folder`` is given (at ``cadence``: its gather
    setting, default every 8 steps)."""
    options = dict(VARIANTS[variant]) if variant else {}
    spare, accumulate = options.pop("spare", False), options.pop("accumulate", False)
    buffers = options.pop("buffers", False)
    delay = SLOW if rank == 1 else 0.0
    model = Slow(0.0 if buffers else delay, spare, buffers)
    ddp = DistributedDataParallel(model, **options)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    batches = loader(rank)
    reports = []
    probe = None
    if folder is not None:
        cadence = cadence or {"every": 8}
        probe = StragglerProbe(folder, **cadence, on_report=reports.append).watch(ddp)
        batches = probe.batches(batches)
    for i, (x, y) in enumerate(batches):
        if buffers:
            time.sleep(delay)  # in the step, before DDP's forward and its buffer broadcast
        if accumulate and i % 2 == 0:
            with ddp.no_sync():
                F.mse_loss(ddp(x), y).backward()
            continue
        F.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    history = probe.history if probe is not None and rank == 0 else None
    reports = [r.as_dict() for r in reports]
    planned = probe.next_gather if probe is not None else None
    return {"theta": flat(ddp.module), "reports": reports, "history": history, "planned": planned}


def run_loop(rank: int, folder: str) -> dict:
    """An own loop: the probe's ``step`` and ``sync`` around a hand-written allreduce."""
    net = Slow(SLOW if rank == 1 else 0.0)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    reports = []
    probe = StragglerProbe(folder, every=8, on_report=reports.append)
    for x, y in loader(rank):
        with probe.step():
            optimizer.zero_grad()
            F.mse_loss(net(x), y).backward()
            with probe.sync():
                for p in net.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= N
            optimizer.step()
    probe.close()
    return {"theta": flat(net), "reports": [r.as_dict() for r in reports]}


def run_no_sync_always(rank: int, folder: str) -> dict:
    """A DDP model whose every backward runs under ``no_sync``, the gradients averaged by a
    hand-written all_reduce the probe is not told of, the optimizer stepping each batch: no
    reduction ends a step, the optimizer's step does."""
    ddp = DistributedDataParallel(Slow(SLOW if rank == 1 else 0.0))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    probe = StragglerProbe(folder, every=8).watch(ddp)
    for x, y in probe.batches(loader(rank)):
        with ddp.no_sync():
            F.mse_loss(ddp(x), y).backward()
        for p in ddp.parameters():
            dist.all_reduce(p.grad)
            p.grad /= N
        optimizer.step()
        optimizer.zero_grad()
    return {"history": probe.history if rank == 0 else None}


def rank_main(rank: int, port: int, folder: str) -> None:
    join(rank, port, N)
    out = {
        "no-sync-always": run_no_sync_always(rank, f"{folder}/no-sync-always"),
        "plain": run_ddp(rank, None),
        "probe": run_ddp(rank, f"{folder}/ddp"),
        "loop": run_loop(rank, f"{folder}/loop"),
        "interval": run_ddp(rank, f"{folder}/interval", cadence={"interval": INTERVAL_S}),
    }
    for variant in VARIANTS:
        out[f"{variant}-plain"] = run_ddp(rank, None, variant)
        out[variant] = run_ddp(rank, f"{folder}/{variant}", variant)
    torch.save(out, f"{folder}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("probe")
    return folder, run_ranks(rank_main, folder, N)


@pytest.mark.timeout(120)
def test_the_probe_changes_no_parameter(results):
    _, ranks = results
    for out in ranks:
        assert torch.equal(out["probe"]["theta"], out["plain"]["theta"])  # bit for bit


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["ddp", "loop"])
def test_the_trace_and_the_verdicts_agree_with_the_injected_delay(results, case):
    folder, ranks = results
    trace = read_trace(folder / case / "trace.csv")
    assert trace.iteration.max() == STEPS - 1 and set(trace.worker.tolist()) == {0, 1}
    own = {w: trace.seconds[trace.worker == w] for w in (0, 1)}
    assert (own[1] >= SLOW).all()  # every one of rank 1's steps holds its sleep
    assert np.median(own[1] - own[0]) >= SLOW / 2
    report = (ranks[0]["probe"] if case == "ddp" else ranks[0]["loop"])["reports"][-1]
    assert report["step"] == STEPS
    assert report["sections"]["wait"][0] >= SLOW / 2  # rank 0 waits for rank 1, not vice versa
    assert [r["verdict"] for r in report["ranks"]] == ["healthy", "persistent"]
    assert ranks[1][case if case == "loop" else "probe"]["reports"] == []  # rank 0 reports


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_probe_times_ddp_options_alike(results, variant):
    """Each DDP option: no parameter changed, and rank 0 waits for the slow rank 1 in every
    step. Under ``no_sync()`` a step is an optimizer step: the loader batch accumulated
    without a reduction and the one that reduces, their samples summed (the loop's
    ``probe.batches`` wraps each batch), rank 0 waiting for both of rank 1's slow forwards,
    rank 1's compute holding both, and the run's machine row says 2 batches a step."""
    folder, ranks = results
    for out in ranks:
        assert torch.equal(out[variant]["theta"], out[f"{variant}-plain"]["theta"])
    history = ranks[0][variant]["history"]
    wait = history[:, :, 2]  # (steps, ranks)
    batches = 2 if variant == "no_sync" else 1
    assert wait.shape[0] == STEPS // batches
    assert (history[:, :, SAMPLES] == 8 * batches).all()
    assert np.median(wait[:, 0]) >= batches * SLOW / 2
    assert np.median(wait[:, 1]) < SLOW / 2
    assert np.median(history[:, 1, 1]) >= batches * SLOW  # rank 1's compute: its sleeps
    row = read_machine(folder / variant, 0)
    assert row.get("accumulates", 1) == batches


@pytest.mark.timeout(120)
def test_the_ranks_agree_on_a_cadence_in_seconds(results):
    """At ``interval=``, each gather comes after the steps every rank planned from the window
    last taken when it issued the one before (the first window, after warm-up +
    LIVE_MIN_STEPS, is taken at once; a later one at the next step); the parameters stay bit
    for bit those of the loop without the probe."""
    folder, ranks = results
    for out in ranks:
        assert torch.equal(out["interval"]["theta"], out["plain"]["theta"])
    assert ranks[0]["interval"]["planned"] == ranks[1]["interval"]["planned"]
    history = ranks[0]["interval"]["history"]
    steps = [r["step"] for r in ranks[0]["interval"]["reports"]]
    assert steps[0] == 2 + LIVE_MIN_STEPS and steps[-1] == STEPS  # the loader's end flushes
    assert len(steps) >= 3  # 24 steps of about 40 ms: windows of about 7 steps
    windows = [history[a:b] for a, b in zip([0, *steps], steps, strict=False)]
    for k in range(len(steps) - 1):
        planned = window_steps(windows[max(k - 1, 0)], INTERVAL_S)
        gap = steps[k + 1] - steps[k]
        assert gap == planned or (steps[k + 1] == STEPS and gap < planned)
    assert len(read_trace(folder / "interval" / "trace.csv").iteration) == STEPS * N


def test_window_steps_is_the_interval_over_the_mean_step():
    """A step's wall time is its longest rank's data + compute + wait; the plan is integer
    microseconds, so every rank that holds the window gets the same count."""
    window = np.zeros((4, 3, 3))
    window[:, :, 1] = 0.06  # compute
    window[:, :, 2] = 0.02  # wait
    window[:, 1, 0] = [0.02, 0.02, 0.02, 0.02]  # rank 1's data: its steps take 0.1 s
    assert window_steps(window, 2.0) == 20
    assert window_steps(window, 0.25) == 2  # rounded down: never later than the interval
    assert window_steps(window, 0.01) == 1
    assert window_steps(window, 1e4) == MAX_WINDOW
    assert window_steps(np.zeros((2, 2, 3)), 2.0) == MAX_WINDOW


def test_the_probe_needs_a_positive_cadence():
    for bad in ({"interval": 0.0}, {"every": 0}):
        with pytest.raises(ValueError, match="interval > 0"):
            StragglerProbe(None, **bad)


def run_steps(probe: StragglerProbe, steps: int) -> list[int]:
    """``steps`` empty ``with probe.step():`` steps; the step counts at which the probe
    gathers (the list grows by ``flush``'s gather, if any)."""
    gathered = []
    gather = probe._gather

    def noted(wait: bool = False) -> None:
        gathered.append(probe.steps)
        gather(wait)

    probe._gather = noted
    for _ in range(steps):
        with probe.step():
            pass
    return gathered


def test_a_step_loop_reports_its_last_window_at_close(tmp_path):
    """In a ``step()`` loop the last gather is taken at the next step or at ``flush``: the
    steps after it are reported only by ``close``, or by leaving the probe's ``with``."""
    probe = StragglerProbe(tmp_path / "open", every=10)
    run_steps(probe, 40)
    probe._drain()  # the reports made so far (on the reporting thread)
    assert probe.history.shape[0] == 30 and probe.last.step == 30  # the last window is out
    probe.close()
    assert probe.history.shape[0] == 40 and probe.last.step == 40
    assert read_trace(tmp_path / "open" / "trace.csv").iteration.max() == 39
    with StragglerProbe(tmp_path / "with", every=10) as probe:
        run_steps(probe, 40)
    assert probe.history.shape[0] == 40 and probe.last.step == 40 and probe.reporter is None
    assert read_trace(tmp_path / "with" / "trace.csv").iteration.tolist() == list(range(40))


class Board:
    """Stands in for the TensorBoard log: notes that it was closed."""

    closed = False

    def close(self) -> None:
        self.closed = True


def test_a_failing_report_is_raised_at_close_and_changes_nothing_else(tmp_path, caplog):
    """``on_report`` raising on its 2nd call (step 6, on the reporting thread): it is logged,
    every window still enters the history and the trace, the gathers come at the same steps
    as without the error, and ``close`` raises it once the last window is taken, the thread
    ended and TensorBoard closed."""
    calls = []

    def on_report(report) -> None:
        calls.append(report.step)
        if len(calls) == 2:
            raise RuntimeError("report 2 failed")

    clean = StragglerProbe(None, every=3)
    planned = run_steps(clean, 40)
    clean.close()
    probe = StragglerProbe(tmp_path, every=3, on_report=on_report)
    probe.board = board = Board()
    gathered = run_steps(probe, 40)
    with pytest.raises(RuntimeError, match="report 2 failed"):
        probe.close()
    assert gathered == planned == [*range(3, 40, 3), 40]  # no gather skipped or moved
    assert calls == [*range(3, 40, 3), 40]  # every window reported, in order
    assert probe.history.shape[0] == 40 and probe.last.step == 40
    assert read_trace(tmp_path / "trace.csv").iteration.tolist() == list(range(40))
    assert read_machine(tmp_path, 0)["cores"] >= 1  # the cores and load advise warns of
    # a user's step is a computation, which no threshold cuts once begun
    assert read_machine(tmp_path, 0)["cut"] is False
    assert not parse_delay(f"trace:path={tmp_path / 'trace.csv'}").cuttable
    assert board.closed and probe.reporter is None and probe.reports == []
    assert "the report at step 6 failed" in caplog.text
    probe.close()  # raised once: a second close has nothing to raise


def test_leaving_the_probe_on_an_error_gathers_nothing_more():
    """An exception out of the loop: the other ranks may never reach a gather, so leaving
    the ``with`` only ends the reporting thread and lets the exception through."""
    with pytest.raises(KeyError), StragglerProbe(None, every=10) as probe:
        run_steps(probe, 25)
        raise KeyError("the loop failed")
    assert probe.history.shape[0] == 20 and probe.reporter is None and probe.pending


@pytest.mark.timeout(60)
def test_the_probe_keeps_no_ddp_model_alive():
    """A watched DDP model dropped by the loop is freed although the probe lives on: a probe
    holding it would hold DDP's reducer and so its process group past
    ``destroy_process_group``, gloo's threads running into the process's exit."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(nn.Linear(3, 2))
        probe = StragglerProbe(None, every=2, warmup=0).watch(ddp)
        for x in probe.batches([torch.ones(4, 3)] * 3):
            ddp(x).sum().backward()
        assert probe.steps == 3
        freed = weakref.ref(ddp)
        del ddp
        gc.collect()
        assert freed() is None
    finally:
        dist.destroy_process_group()


def test_rank_zero_keeps_only_the_steps_a_verdict_reads():
    """Five windows of 100 steps, horizon 150: the history holds the last 150 steps, however
    long the run, and the verdicts are those of the whole history's last 150 steps after the
    warm-up (what an unbounded history gave). Rank 2 is slow only in the first 300 steps (out
    of the horizon: healthy), rank 3 only in the last 150 (persistent)."""
    rng = np.random.default_rng(0)
    full = rng.uniform(0.009, 0.011, size=(500, 4, 4))
    full[:, :, SAMPLES] = 8  # the same samples on every rank: seconds per step are judged
    full[:300, 2, 1] *= 3
    full[350:, 3, 1] *= 3
    probe = StragglerProbe(None, every=10**6, horizon=150, warmup=2)
    probe.world = 4
    probe.history = np.empty((0, 4, 4))
    for start in range(0, 500, 100):
        probe._report(full[start : start + 100])
    assert probe.history.shape == (150, 4, 4) and probe.reported == probe.last.step == 500
    np.testing.assert_array_equal(probe.history, full[-150:])
    recent = full[max(2, 500 - 150) :]
    expected = classify_workers(recent[:, :, 0] + recent[:, :, 1])
    assert probe.last.verdicts == expected
    assert [v.verdict for v in expected] == ["healthy", "healthy", "healthy", "persistent"]
    # a horizon reaching back into the warm-up still leaves the warm-up out
    short = StragglerProbe(None, every=10**6, horizon=150, warmup=60)
    short.world, short.history = 4, np.empty((0, 4, 4))
    short._report(full[:100])
    assert short.history.shape[0] == 100
    assert short.last.verdicts == classify_workers(full[60:100, :, 0] + full[60:100, :, 1])


def test_a_ranks_rows_tile_its_time_between_epochs_too(tmp_path):
    """The time between two epochs (here a 0.2 s sleep: an evaluation, ``set_epoch``, the
    probe's flush) is the wait of the next epoch's first step, not its compute: the rows'
    seconds + noncompute add up to the loop's wall, as advise's samples per second reads
    them (a first trial's job read 3-4% fast without it)."""
    probe = StragglerProbe(tmp_path, every=100, warmup=0)
    began = time.perf_counter()
    for epoch in range(2):
        if epoch:
            time.sleep(0.2)
        for _ in probe.batches([torch.zeros(4, 1)] * 3):
            time.sleep(0.02)
    wall = probe._closed_at - began  # to the last step's end (the last flush is no step's)
    probe.close()
    trace = read_trace(tmp_path / "trace.csv")
    assert trace.noncompute[3] >= 0.2 and (trace.noncompute[[0, 1, 2, 4, 5]] < 0.1).all()
    assert (trace.seconds < 0.1).all()
    # the rows add up to the wall but for the microseconds before the first step opened
    assert (trace.seconds + trace.noncompute).sum() == pytest.approx(wall, abs=0.005)


def test_begin_step_and_end_step_are_a_step_in_two_calls(tmp_path):
    """A step opened by ``begin_step`` (the data seconds its caller timed, its samples) and
    closed by ``end_step``, as a trainer's callbacks do: the data and samples given are the
    window's and the trace's; a ``begin_step`` while a step is open closes it first, and an
    ``end_step`` with none open adds no step."""
    probe = StragglerProbe(tmp_path, every=3, warmup=0)
    for i in range(5):
        probe.begin_step(samples=4 + i, data=0.25 * i)
        if i % 2 == 0:
            probe.end_step()
    probe.end_step()
    probe.close()
    assert probe.steps == 5 and probe.history.shape[0] == 5
    np.testing.assert_array_equal(probe.history[:, 0, 0], [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(probe.history[:, 0, SAMPLES], [4, 5, 6, 7, 8])
    assert (probe.history[:, 0, 1] < 0.25).all()  # the data given is not the step's compute
    trace = read_trace(tmp_path / "trace.csv")
    assert trace.iteration.tolist() == list(range(5))
    assert (trace.seconds >= 0.25 * np.arange(5)).all()  # seconds = data + compute


def test_a_rank_judged_per_sample_is_also_said_per_step(caplog):
    """A rebalanced job's ranks compute different samples a step, so the verdict's own time
    is per sample; the line gives the step's own time beside it, the figure a run before the
    shares said, so the two runs' lines compare."""
    rng = np.random.default_rng(0)
    times = 0.0005 * (1 + 0.05 * rng.random((20, 2)))
    times[:, 1] *= 3
    sections = {"data": [0.001, 0.002], "compute": [0.024, 0.022], "wait": [0.0, 0.002]}
    report = ProbeReport(20, 1.0, classify_workers(times), sections, per_sample=True)
    with caplog.at_level("WARNING", logger="tailtrain.probe"):
        StragglerProbe(None)._log(report)
    assert "ms per sample (24 ms per step), wait 2.0 ms per step" in caplog.text


@pytest.mark.timeout(120)
def test_an_optimizer_step_ends_a_step_that_no_reduction_ends(results):
    """Every forward under ``no_sync`` and a reduction of the loop's own: each batch is still
    a step (the optimizer stepped), not one step per epoch, and no accumulation is said."""
    folder, ranks = results
    assert ranks[0]["no-sync-always"]["history"].shape[0] == STEPS
    assert "accumulates" not in read_machine(folder / "no-sync-always", 0)


def test_closing_the_probe_removes_its_optimizer_hook():
    """The watch's optimizer step post-hook is global; a closed probe takes it away."""
    from torch.optim.optimizer import _global_optimizer_post_hooks

    class Stub(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)

    from tailtrain.integrate.probe.clocks import DdpWatch

    probe = StragglerProbe(None)
    before = len(_global_optimizer_post_hooks)
    stub = Stub()
    probe._ddp_watch = DdpWatch(probe, stub)
    assert len(_global_optimizer_post_hooks) == before + 1
    hooked = [stub._forward_pre_hooks, stub.module._forward_pre_hooks, stub._forward_hooks]
    assert [len(h) for h in hooked] == [1, 1, 1]
    probe.close()
    assert len(_global_optimizer_post_hooks) == before
    # the model's forward hooks go too: the user's model keeps no closed probe alive
    assert [len(h) for h in hooked] == [0, 0, 0]


def test_a_ddp_forward_that_skips_the_module_s_hooks_leaves_no_mark_behind():
    """DDP may call its module's ``forward`` past the module's hooks; its own forward hook
    then clears the mark, so a later direct call of the module (an evaluation inside a step)
    is charged nothing."""
    from tailtrain.integrate.probe.clocks import DdpWatch, StepMarks

    class Skipping(torch.nn.Module):  # DDP's forward as under _delay_all_reduce_all_params
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)
            self.require_backward_grad_sync = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.module.forward(x)

    probe = StragglerProbe(None)
    skipping = Skipping()
    probe._ddp_watch = DdpWatch(probe, skipping)
    probe.current = StepMarks(0.0, probe.clock.mark())
    skipping(torch.zeros(1, 2))
    time.sleep(0.05)
    skipping.module(torch.zeros(1, 2))
    assert probe.current.waited == 0.0
    probe.current = None
    probe.close()
