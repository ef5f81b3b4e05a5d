"""`tailtrain train` from the command line: simulate's flags, its outputs, one-line errors."""

from __future__ import annotations

import json
import socket
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from tests.cli.helpers import run

from tailtrain.core.machine import read_machine
from tailtrain.delays.trace import read_trace

DELAY = "const:value=0.06"
PATTERN = "rotating:low=0,high=0.12"  # partial sums >= 30 ms from tau = 0.15
FLAGS = [
    "--task", "logreg",
    "--workers", "3",
    "--micro-batches", "2",
    "--delay", DELAY,
    "--pattern", PATTERN,
    "--strategy", "dropcompute:threshold=0.15,stop=between",
    "--iterations", "20",
    "--eval-every", "10",
    "--seed", "3",
]  # fmt: skip


@pytest.mark.timeout(120)
def check_every_second_is_exported(steps: pd.DataFrame, summary: dict, trace_path) -> None:
    """Each part of each round >= 0, the parts sum to its wall seconds, the summary's means to
    the mean round, and the trace's recorded T^c is what the slowest rank did not compute."""
    parts = [np.array(steps[c].tolist()) for c in ("rank_wait", "rank_comm", "rank_overhead")]
    compute, injected = (np.array(steps[c].tolist()) for c in ("rank_compute", "rank_injected"))
    for part in (*parts, compute - injected, injected):
        assert (part >= 0).all()
    wall = np.broadcast_to(steps["step_time"].to_numpy()[:, None], compute.shape)
    np.testing.assert_allclose(compute + sum(parts), wall)
    means = sum(summary[f"mean_{p}_time"] for p in ("compute", "injected", "wait", "comm"))
    means += summary["mean_overhead_time"]
    assert means == pytest.approx(summary["mean_iteration_time"])
    trace = read_trace(trace_path)
    units = np.zeros((len(steps), int(trace.worker.max()) + 1))
    np.add.at(units, (trace.iteration, trace.worker), trace.seconds)
    expected = steps["step_time"].to_numpy() - units.max(axis=1)
    np.testing.assert_allclose(trace.round_comm(), expected)


def test_train_with_simulates_flags_makes_its_decisions_and_records(tmp_path, capfd):
    code, out, err = run(["train", *FLAGS, "--out", str(tmp_path / "train"), "--json"], capfd)
    assert code == 0, err
    trained = json.loads(out)
    code, out, _ = run(
        ["simulate", *FLAGS, "--out", str(tmp_path / "sim"), "--json", "--no-progress"], capfd
    )
    simulated = json.loads(out)
    means = {f"mean_{part}_time" for part in ("compute", "injected", "wait", "comm", "overhead")}
    assert set(trained) == (set(simulated) - {"virtual_time"}) | {"wall_time"} | means
    steps = pd.read_json(tmp_path / "train" / "steps.jsonl", lines=True)
    sim_steps = pd.read_json(tmp_path / "sim" / "steps.jsonl", lines=True)
    extra = {"rank_compute", "rank_injected", "rank_wait", "rank_comm", "rank_overhead"}
    assert set(sim_steps.columns) | extra | {"step_time"} == set(steps.columns)
    check_every_second_is_exported(steps, trained, tmp_path / "train" / "trace.csv")
    # rounds where a rank spent >= 30 ms outside its injected sleeps (a stalled machine) do
    # not test the rule: there the real time, not the injected, decides
    real = np.array(steps["rank_compute"].tolist()) - np.array(steps["rank_injected"].tolist())
    keep = real.max(axis=1) < 0.03
    assert keep.mean() >= 0.75
    pairs = zip(steps["completed"][keep], sim_steps["completed"][keep], strict=True)
    assert np.mean([a == b for a, b in pairs]) >= 0.95
    evals = pd.read_json(tmp_path / "train" / "evals.jsonl", lines=True)
    assert evals["step"].tolist() == [0, 10, 20]
    trace = read_trace(tmp_path / "train" / "trace.csv")
    assert trace.micro_batch is not None
    counted = trace.seconds.size if trace.censored is None else int((~trace.censored).sum())
    assert counted == sum(map(sum, steps["completed"]))  # the rest: censored rows tau cut
    assert sorted(set(trace.worker.tolist())) == [0, 1, 2]
    for rank in range(3):
        assert read_trace(tmp_path / "train" / f"trace-rank{rank}.csv").seconds.size > 0
    machine = read_machine(tmp_path / "train", 0)  # the cores and load advise warns of
    assert machine["local_ranks"] == 3 and machine["cores"] >= 1 and len(machine["load"]) == 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["eager:mode=solo", "dbw-quorum"])
def test_a_partial_collective_run_writes_the_trace_advise_reads(strategy, tmp_path, capfd):
    """``train --out`` writes ``trace.csv`` on every topology that measures units: a partial
    collective's unit is a rank's job, its iteration the job's index."""
    argv = ["train", "--task", "logreg", "--workers", "2", "--iterations", "6"]
    out = tmp_path / "run"
    code, _, err = run([*argv, "--strategy", strategy, "--out", str(out), "--json"], capfd)
    assert code == 0, err
    trace = read_trace(out / "trace.csv")
    assert trace.micro_batch is None and sorted(set(trace.worker.tolist())) == [0, 1]
    for rank in (0, 1):
        mine = read_trace(out / f"trace-rank{rank}.csv")
        assert mine.seconds.size >= 1 and (mine.seconds > 0).all()
    assert trace.seconds.size == sum(
        read_trace(out / f"trace-rank{r}.csv").seconds.size for r in (0, 1)
    )
    code, advice, err = run(["advise", "--trace", str(out / "trace.csv"), "--json"], capfd)
    assert code == 0, err
    assert json.loads(advice)["trace_workers"] == 2


@pytest.mark.timeout(60)
def test_a_crashing_rank_fails_the_job_naming_the_rank(capfd):
    """``--fail-at`` is the deprecated spelling of the raise drill."""
    argv = ["train", "--task", "logreg", "--workers", "3", "--iterations", "6"]
    code, out, err = run([*argv, "--fail-at", "1:2", "--timeout", "30"], capfd)
    assert code != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "rank 1 failed" in lines[0] and "step 2" in lines[0], err
    assert "raise:rank=1,step=2" in lines[0], err


#: topology -> strategy, the rank that raises (a parameter server's rank 0 is its server)
RAISES = {
    "allreduce": ("sync", 1),
    "partial collective": ("eager", 1),
    "parameter server": ("k-sync:k=1", 0),
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("topology", RAISES)
def test_the_raise_drill_fails_the_job_naming_rank_and_step_on_every_topology(topology, capfd):
    """A raise drill is met where every topology meets a drill (``FaultDrill.before``): no
    topology can ignore it, as eager once ignored ``--fail-at``."""
    strategy, rank = RAISES[topology]
    argv = ["train", "--task", "logreg", "--workers", "2", "--iterations", "10"]
    drill = f"raise:rank={rank},step=3"
    flags = ["--strategy", strategy, "--inject-fault", drill, "--timeout", "30"]
    code, out, err = run([*argv, *flags], capfd)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"rank {rank} failed" in lines[0], err
    assert f"InjectedFault: rank {rank} fails at step 3 (--inject-fault {drill})" in lines[0]


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


BAD = {
    "no workers": (["--workers", "0"], "--workers"),
    "too many workers": (["--workers", "100000"], "too many"),
    "unknown backend": (["--backend", "mpi"], "--backend"),
    "zero timeout": (["--timeout", "0"], "--timeout"),
    "zero worker timeout": (["--worker-timeout", "0"], "--worker-timeout"),
    "pattern without delay": (["--pattern", "persistent:h=2"], "--delay"),
    "no model": (["--task", "none"], "no model"),
    "bad fault": (["--fail-at", "one"], "RANK:STEP"),
    "raise of no rank": (["--inject-fault", "raise:rank=2,step=1"], "ranks are 0..1"),
    "bad endpoint": (["--rdzv-endpoint", "localhost"], "HOST:PORT"),
    "remote endpoint": (["--rdzv-endpoint", "192.0.2.1:29500"], "unreachable"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_one_line_and_exit_2(name, capfd):
    flags, needle = BAD[name]
    code, out, err = run(["train", "--task", "logreg", "--workers", "2", *flags], capfd)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.timeout(60)
def test_a_port_in_use_is_one_line_and_exit_2(busy_port, capfd):
    flags = ["--task", "logreg", "--workers", "2", "--rdzv-endpoint", f"127.0.0.1:{busy_port}"]
    code, out, err = run(["train", *flags], capfd)
    assert out == ""
    assert code == 2 and len(err.strip().splitlines()) == 1 and "in use" in err, err


@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_nccl_without_cuda_is_one_line_and_exit_2(capfd):
    code, _, err = run(["train", "--task", "logreg", "--workers", "2", "--backend", "nccl"], capfd)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "CUDA" in err, err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["sync", "eager:mode=majority"])
def test_shrink_on_nccl_is_one_line_and_exit_2_before_any_rank_starts(capfd, monkeypatch, strategy):
    """Every new generation of a shrink is a gloo group on CPU tensors: ``--on-rank-loss
    shrink`` refuses nccl for both topologies that shrink, with the same line, on a machine
    with GPUs or without (``runtime.elastic.refusals``)."""
    started = []
    monkeypatch.setattr(
        "tailtrain.runtime.launching.launch.launch", lambda *a, **k: started.append(a)
    )
    argv = ["train", "--task", "logreg", "--workers", "2", "--strategy", strategy]
    argv += ["--backend", "nccl"]
    code, out, err = run([*argv, "--on-rank-loss", "shrink"], capfd)
    assert code == 2 and out == "" and started == []
    assert len(err.strip().splitlines()) == 1, err
    assert "--on-rank-loss shrink forms each new generation's groups with gloo on CPU" in err


@pytest.mark.timeout(90)
def test_a_sync_with_a_mode_trains_on_the_parameter_server(capfd):
    """``train --strategy sync:mode=pull`` honours its mode: it runs where ``simulate`` runs
    it, on the parameter server, with one extra rank."""
    argv = ["train", "--task", "logreg", "--workers", "2", "--iterations", "3", "--json"]
    code, out, err = run([*argv, "--strategy", "sync:mode=pull", "--timeout", "60"], capfd)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["strategy"] == "sync:mode=pull" and summary["iterations"] == 3
    assert summary.get("topology") == "parameter-server" and len(summary["worker_jobs"]) == 2


@pytest.mark.timeout(60)
def test_a_rule_the_workers_cannot_run_is_refused_before_any_rank_starts(capfd):
    """The rule's own checks run with the job's worker count in ``launching.checks.validate``: one
    line, exit 2, and a parameter server's says that rank 0 is the server."""
    argv = ["train", "--task", "logreg", "--workers", "4", "--iterations", "3"]
    code, out, err = run([*argv, "--strategy", "k-sync:k=9"], capfd)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "rank 0 failed" not in err, err
    assert "k=9" in err and "rank 0 is the parameter server" in err and "4 workers" in err, err


@pytest.mark.timeout(60)
def test_under_torchrun_rank_0_refuses_a_rule_in_one_line_and_the_others_quietly(
    monkeypatch, capfd
):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["train", "--task", "logreg", "--strategy", "k-sync:k=9", "--iterations", "3"]
    outcomes = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        outcomes[rank] = run([*argv, "--timeout", "2"], capfd)
    code, out, err = outcomes["0"]
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "rank 0 is the parameter server" in err and "3 workers" in err, err
    assert outcomes["1"] == (2, "", "")


@pytest.mark.timeout(60)
def test_an_unreachable_rendezvous_under_torchrun_is_one_line_and_exit_2(monkeypatch, capfd):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = run(["train", "--task", "logreg", "--timeout", "0.5"], capfd)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "cannot reach the rendezvous" in err, err


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "strategy", ["dropcompute:threshold=0.15", "k-sync:k=1", "eager:mode=solo"]
)  # one per topology: allreduce, parameter server, partial collectives
def test_tensorboard_events_hold_rank_0s_rows(strategy, tmp_path, capfd):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board, out = tmp_path / "tb", tmp_path / "run"
    argv = ["train", "--task", "logreg", "--workers", "2", "--iterations", "8"]
    argv += ["--eval-every", "4", "--strategy", strategy, "--seed", "1"]
    code, printed, err = run([*argv, "--out", str(out), "--tensorboard", str(board)], capfd)
    assert code == 0, err
    assert f"tensorboard: {board}" in printed
    steps = [json.loads(line) for line in (out / "steps.jsonl").open()]
    evals = [json.loads(line) for line in (out / "evals.jsonl").open()]
    events = EventAccumulator(str(board))
    events.Reload()
    loss = events.Scalars("train/minibatch_loss")
    assert [e.step for e in loss] == [row["step"] + 1 for row in steps]
    assert [e.value for e in loss] == pytest.approx([row["loss"] for row in steps], rel=1e-6)
    assert [e.wall_time for e in loss] == pytest.approx([row["time"] for row in steps])
    gaps = np.diff([0.0, *(row["time"] for row in steps)])
    assert [e.value for e in events.Scalars("time/iteration")] == pytest.approx(gaps, rel=1e-6)
    if "k" in steps[0]:
        assert [e.value for e in events.Scalars("strategy/k")] == [row["k"] for row in steps]
    if "drop_rate" in steps[0]:
        drops = [e.value for e in events.Scalars("strategy/drop_rate")]
        assert drops == pytest.approx([row["drop_rate"] for row in steps], rel=1e-6)
    accuracy = events.Scalars("eval/test_accuracy")
    assert [(e.step, e.value) for e in accuracy] == [
        (row["step"], pytest.approx(row["eval"], rel=1e-6)) for row in evals
    ]


def test_tensorboard_missing_is_one_line_and_exit_2(tmp_path, capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    argv = ["train", "--task", "logreg", "--workers", "2", "--tensorboard", str(tmp_path / "tb")]
    code, out, err = run(argv, capfd)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "pip install tailtrain[tensorboard]" in lines[0]


@pytest.mark.timeout(60)
def test_resume_honours_an_explicit_max_restarts_0_and_the_default_timeout(tmp_path):
    """--max-restarts 0 and --timeout 300 (the start's defaults) given with --resume replace
    the run's own values; left out, the run's own hold."""
    from tailtrain.cli import build_parser
    from tailtrain.cli.train import fresh, resumed

    folder = tmp_path / "run"
    start = ["train", "--task", "logreg", "--workers", "2", "--out", str(folder)]
    _, prepare = fresh(build_parser().parse_args([*start, "--max-restarts", "1", "--timeout", "9"]))
    prepare()
    config, _ = resumed(build_parser().parse_args(["train", "--resume", str(folder)]))
    assert (config.max_restarts, config.timeout) == (1, 9.0)
    again = ["train", "--resume", str(folder), "--max-restarts", "0", "--timeout", "300"]
    config, _ = resumed(build_parser().parse_args(again))
    assert (config.max_restarts, config.timeout) == (0, 300.0)
    config, _ = fresh(build_parser().parse_args(start[:-2]))
    assert (config.max_restarts, config.timeout) == (0, 300.0)  # a start's defaults


def test_resume_keeps_the_runs_on_rank_loss_and_restart_lost(tmp_path):
    """--on-rank-loss and --restart-lost are the run's (run.json): --resume need not repeat
    them, may give them anew, and a run.json from before they were kept resumes with stop."""
    from tailtrain.cli import build_parser
    from tailtrain.cli.train import fresh, resumed

    folder = tmp_path / "run"
    start = ["train", "--task", "logreg", "--workers", "2", "--out", str(folder)]
    shrink = ["--on-rank-loss", "shrink", "--restart-lost", "2"]
    _, prepare = fresh(build_parser().parse_args([*start, *shrink]))
    prepare()
    info = json.loads((folder / "run.json").read_text())
    assert (info["runtime"]["on_rank_loss"], info["runtime"]["restart_lost"]) == ("shrink", 2)
    config, _ = resumed(build_parser().parse_args(["train", "--resume", str(folder)]))
    assert (config.on_rank_loss, config.restart_lost) == ("shrink", 2)
    again = ["train", "--resume", str(folder), "--restart-lost", "0"]
    config, _ = resumed(build_parser().parse_args(again))
    assert (config.on_rank_loss, config.restart_lost) == ("shrink", 0)
    for key in ("on_rank_loss", "restart_lost"):
        del info["runtime"][key]
    (folder / "run.json").write_text(json.dumps(info))
    config, _ = resumed(build_parser().parse_args(["train", "--resume", str(folder)]))
    assert (config.on_rank_loss, config.restart_lost) == ("stop", 0)


def test_fail_at_is_kept_as_a_raise_drill_and_an_old_runs_fail_at_resumes_as_one(tmp_path):
    from tailtrain.cli import build_parser
    from tailtrain.cli.train import fresh, resumed

    folder = tmp_path / "run"
    start = ["train", "--task", "logreg", "--workers", "2", "--out", str(folder)]
    config, prepare = fresh(build_parser().parse_args([*start, "--fail-at", "1:3"]))
    assert config.faults.describe() == ["raise:rank=1,step=3"]
    prepare()
    info = json.loads((folder / "run.json").read_text())
    assert info["inject_fault"] == ["raise:rank=1,step=3"] and info["runtime"]["fail_at"] is None
    info["inject_fault"], info["runtime"]["fail_at"] = [], [1, 3]  # a run from before
    (folder / "run.json").write_text(json.dumps(info))
    config, _ = resumed(build_parser().parse_args(["train", "--resume", str(folder)]))
    assert config.faults.describe() == ["raise:rank=1,step=3"]


def test_the_cli_defaults_are_train_configs():
    """train's --timeout and --max-restarts defaults are written out in the CLI (it imports
    the runtime only to run); they must stay TrainConfig's."""
    import dataclasses

    from tailtrain.cli import train
    from tailtrain.runtime.config import TrainConfig

    fields = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    assert (
        fields["timeout"],
        fields["max_restarts"],
        fields["on_rank_loss"],
        fields["restart_lost"],
    ) == (
        train.DEFAULT_TIMEOUT,
        train.DEFAULT_MAX_RESTARTS,
        train.DEFAULT_ON_RANK_LOSS,
        train.DEFAULT_RESTART_LOST,
    )
