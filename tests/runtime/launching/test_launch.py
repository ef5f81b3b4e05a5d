"""Checks before launching: endpoints, torchrun detection, worker counts."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tailtrain.cli.train import workers
from tailtrain.core.machine import max_local_workers
from tailtrain.core.scenario import Scenario
from tailtrain.errors import UsageError
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.launching.checks import in_torchrun, validate
from tailtrain.runtime.launching.endpoint import Endpoint, check_rendezvous, parse_endpoint, reserve
from tailtrain.runtime.launching.launch import reaches_fork_server, start_method


def test_endpoints_parse():
    assert parse_endpoint("127.0.0.1:0") == Endpoint("127.0.0.1", 0)
    assert parse_endpoint("[::1]:29500") == Endpoint("::1", 29500)
    for bad in ("localhost", ":80", "host:port", "host:70000"):
        with pytest.raises(UsageError, match="HOST:PORT"):
            parse_endpoint(bad)


def test_port_zero_reserves_a_free_port_and_a_busy_one_is_refused():
    free = reserve(Endpoint("127.0.0.1", 0))
    assert free.port > 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.raises(UsageError, match="in use"):
            reserve(Endpoint("127.0.0.1", sock.getsockname()[1]))


def test_torchrun_is_recognised_by_its_environment():
    assert in_torchrun({"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h"})
    assert not in_torchrun({"RANK": "1", "WORLD_SIZE": "4"})


def test_workers_default_locally_and_follow_torchrun():
    assert workers(None, None) == 16 and workers(3, None) == 3
    assert workers(None, {"WORLD_SIZE": "4"}) == 4 and workers(4, {"WORLD_SIZE": "4"}) == 4
    with pytest.raises(UsageError, match="torchrun started 4"):
        workers(2, {"WORLD_SIZE": "4"})
    assert 1 <= max_local_workers() <= 64


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_torchrun_rendezvous_is_refused_in_one_line():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    with pytest.raises(UsageError, match="cannot reach the rendezvous") as err:
        check_rendezvous({**env, "MASTER_PORT": str(closed_port())}, timeout=0.3)
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="does not resolve"):
        check_rendezvous({**env, "MASTER_ADDR": "no-such-host.invalid"}, timeout=0.3)


def test_a_rank_0_outside_torchrun_hosts_the_store_itself():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    check_rendezvous({**env, "MASTER_PORT": str(closed_port())}, timeout=0.3)


def test_only_an_entry_the_fork_server_can_import_starts_there():
    import functools

    from tailtrain.runtime.launching.own_model import own_entry
    from tailtrain.runtime.ps.server import train_parameter_server

    def closure(config, comm):
        return config

    assert reaches_fork_server(None)
    assert reaches_fork_server(train_parameter_server)
    assert reaches_fork_server(functools.partial(own_entry, (len, sorted, None, 8)))
    assert not reaches_fork_server(closure)
    assert not reaches_fork_server(functools.partial(own_entry, (closure, len, None, 8)))
    assert not reaches_fork_server(lambda config, comm: None)


SCRIPT = """
import functools
from tailtrain.runtime.launching.launch import reaches_fork_server
from tailtrain.runtime.launching.own_model import own_entry

def model():
    pass

if __name__ == "__main__":
    def inside():
        pass
    print(reaches_fork_server(functools.partial(own_entry, (model, len, None, 8))),
          reaches_fork_server(functools.partial(own_entry, (inside, len, None, 8))))
"""


def printed_by_script(folder: Path, text: str) -> list[str]:
    """What a script of ``text`` prints, run as ``python job.py`` (its own ``__main__``)."""
    script = folder / "job.py"
    script.write_text(text)
    src = Path(__file__).resolve().parents[3] / "src"
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_a_scripts_own_functions_reach_the_fork_server_when_its_top_level_defines_them(tmp_path):
    """The fork server's rank re-runs the script's top level, not its ``__main__`` block: a
    function defined there is found, one defined inside the guard would not be (it forks)."""
    assert printed_by_script(tmp_path, SCRIPT) == ["True", "False"]


def test_a_script_without_a_main_block_forks(tmp_path):
    """Re-running a script with no ``if __name__ == "__main__":`` block would launch the job
    again inside every fork-server rank: its functions fork from the launching process."""
    script = (
        "import functools\n"
        "from tailtrain.runtime.launching.launch import reaches_fork_server\n"
        "from tailtrain.runtime.launching.own_model import own_entry\n"
        "def model():\n    pass\n"
        "print(reaches_fork_server(functools.partial(own_entry, (model, len, None, 8))))\n"
    )
    assert printed_by_script(tmp_path, script) == ["False"]


def test_ranks_on_a_gpu_are_spawned_and_cpu_ranks_fork():
    assert start_method(True, own_entry=True) == "spawn"  # CUDA cannot be used after a fork
    assert start_method(False, own_entry=True) == "fork"


def test_a_device_is_checked_against_the_backend():
    scenario = Scenario(task="logreg", workers=2, iterations=2)
    assert TrainConfig(scenario, "sync", backend="nccl").on_cuda
    assert TrainConfig(scenario, "sync", device="cuda").on_cuda
    assert not TrainConfig(scenario, "sync").on_cuda
    with pytest.raises(UsageError, match="unknown device 'tpu'"):
        TrainConfig(scenario, "sync", device="tpu")
    with pytest.raises(UsageError, match="nccl reduces CUDA tensors only"):
        TrainConfig(scenario, "sync", backend="nccl", device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_gloo_on_cuda_without_a_gpu_is_refused_before_any_rank_starts():
    config = TrainConfig(Scenario(task="logreg", workers=2, iterations=2), "sync", device="cuda")
    with pytest.raises(UsageError, match="device cuda needs CUDA GPUs"):
        validate(config, local=True)


@pytest.mark.timeout(60)
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_the_gpu_check_says_there_is_no_gpu_and_exits_0():
    bench = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.py"
    done = subprocess.run([sys.executable, str(bench)], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["cuda"] is False and "no CUDA device" in facts["note"]


def test_the_strategy_is_parsed_once_where_the_job_is_defined(monkeypatch):
    """A spec is parsed when the job is defined; the checks before launch, the launcher and
    every rank (build_world, its topology entry) use the object they were handed."""
    import pickle

    from tailtrain.runtime import config as config_module
    from tailtrain.runtime.config import build_world
    from tailtrain.runtime.launching.topologies import spec_of
    from tailtrain.strategies import registry
    from tailtrain.strategies.base import Strategy

    config = TrainConfig(Scenario(task="logreg", workers=2, iterations=2), "dropcompute")
    assert isinstance(config.strategy, Strategy)
    assert pickle.loads(pickle.dumps(config)).strategy == config.strategy  # to every rank

    def parsed_again(text: str) -> None:
        raise AssertionError(f"{text!r} parsed again")

    monkeypatch.setattr(registry, "parse_strategy", parsed_again)
    monkeypatch.setattr(config_module, "parse_strategy", parsed_again)
    validate(config, local=True)
    build_world(config)
    assert spec_of(config.strategy).processes(2) == 2


def test_replica_groups_are_refused_by_train_before_any_rank_starts():
    """`train` runs one DDP rank per worker: a library Scenario's group_size is for simulate,
    compare and predict (issue 38 item 4)."""
    config = TrainConfig(Scenario(task="logreg", workers=4, iterations=2, group_size=2), "sync")
    with pytest.raises(UsageError, match="replica groups"):
        validate(config, local=True)
