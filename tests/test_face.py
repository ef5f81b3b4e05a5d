"""The public face: ``import tailtrain`` is light, every name resolves, strategies go either way."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import vector_to_parameters

import tailtrain
from tailtrain.core.records import clean
from tailtrain.errors import UsageError

SRC = Path(tailtrain.__file__).resolve().parents[1]
SMALL = {"task": "logreg", "workers": 2, "iterations": 4}


def test_import_tailtrain_loads_no_torch():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    code = "import tailtrain, sys; tailtrain.UsageError; assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("name", tailtrain.__all__)
def test_every_public_name_resolves(name):
    assert getattr(tailtrain, name) is not None
    assert name in dir(tailtrain)


@pytest.mark.parametrize("name", sorted(tailtrain._INTERNAL))
def test_every_internal_path_resolves(name):
    assert tailtrain._internal(name) is not None


def test_type_checking_imports_match_the_table():
    """The TYPE_CHECKING block names the same paths as the lazy table, so a move updates both."""
    tree = ast.parse(Path(tailtrain.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n))
    imported = {
        alias.name: (node.module, alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == tailtrain._FACE


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = tailtrain.nothing


def test_no_submodule_shares_a_face_entrys_name():
    """A subpackage named like an entry would replace it on import (``tailtrain.predict``
    once was both), so none may exist."""
    clashes = [name for name in tailtrain._FACE if importlib.util.find_spec(f"tailtrain.{name}")]
    assert clashes == []


def test_strategy_parses_specs_and_passes_objects_through():
    rule = tailtrain.strategy("dbw")
    assert isinstance(rule, tailtrain.Strategy) and rule.name == "dbw"
    assert tailtrain.strategy(rule) is rule
    with pytest.raises(UsageError, match="unknown strategy"):
        tailtrain.strategy("nope")
    with pytest.raises(UsageError, match="spec such as 'dbw' or a Strategy"):
        tailtrain.strategy(3)


def test_simulate_takes_a_spec_or_an_object_alike():
    scenario = tailtrain.Scenario(**SMALL)
    by_spec = tailtrain.simulate(scenario, "dbw", seed=1)
    by_object = tailtrain.simulate(scenario, tailtrain.strategy("dbw"), seed=1)
    assert by_spec.steps and by_spec.steps == by_object.steps
    assert by_spec.evals == by_object.evals and by_spec.summary == by_object.summary


def test_compare_takes_a_comma_list_or_a_sequence():
    scenario = tailtrain.Scenario(**SMALL)
    listed = tailtrain.compare(scenario, "sync,k-sync:k=1", seeds=[0])
    mixed = tailtrain.compare(scenario, ["sync", tailtrain.strategy("k-sync:k=1")], seeds=[0])
    assert [r["strategy"] for r in listed.rows()] == ["sync", "k-sync:k=1"]
    assert listed.rows() == mixed.rows()


def test_predict_keeps_the_strategy_rows_asked_for():
    scenario = tailtrain.Scenario(**SMALL, delay="exp:rate=1")
    every = tailtrain.predict(scenario)
    assert {"sync", "k-sync", "dropcompute"} <= {r.strategy for r in every.rows}
    one = tailtrain.predict(scenario, "k-sync:k=1")
    assert one.rows and all(r.strategy == "k-sync" and (r.k == 1 or r.best) for r in one.rows)
    with pytest.raises(UsageError, match="no row for"):
        tailtrain.predict(scenario, "lgc:k=1")


def test_predict_prices_dropcompute_at_the_threshold_asked_for():
    """``dropcompute:threshold=X`` is priced at X (it was priced at tau* whatever X said)."""
    scenario = tailtrain.Scenario(**{**SMALL, "micro_batches": 4}, delay="exp:rate=1")
    best = tailtrain.predict(scenario, "dropcompute").rows[0]
    for tau in (best.threshold * 1.5, best.threshold * 3):  # tau* is the best from M mu / 2 up
        asked = tailtrain.predict(scenario, f"dropcompute:threshold={tau}").rows
        assert [r.threshold for r in asked] == [pytest.approx(tau)]
        assert asked[0].effective_speedup < best.effective_speedup
        assert asked[0].drop_rate != pytest.approx(best.drop_rate)


def test_train_refuses_an_unknown_option_in_one_line():
    scenario = tailtrain.Scenario(**SMALL)
    with pytest.raises(UsageError, match="train\\(\\) has no option 'bogus'"):
        tailtrain.train(scenario, "sync", bogus=1)
    with pytest.raises(UsageError, match="backend"):
        tailtrain.train(scenario, "sync", backend="mpi")


def own_model() -> torch.nn.Module:
    """A module-level factory, so the ranks start from the launcher's fork server: a lambda
    forks from this process, which has launched jobs before, and there a rank sometimes
    never joins the group (``runtime.launching.launch.start_method``)."""
    return torch.nn.Linear(2, 2)


def own_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Sixteen labelled points, the same on every rank."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 2, generator=g), torch.randint(0, 2, (16,), generator=g)


def test_train_own_model_parses_its_strategy_as_every_entry_and_returns_a_run_record():
    """One parser (``tailtrain.strategy``) for every entry: a wrong type is refused in its
    words before anything starts; a strategy object runs, and the record is simulate's type,
    its ``theta`` the server's final parameters: loaded into the user's module, they score
    the final evaluation's training loss."""
    parts = {"model": own_model, "loss": F.cross_entropy, "data": own_data}
    with pytest.raises(UsageError, match="spec such as 'dbw' or a Strategy, got int"):
        tailtrain.train_own_model(**parts, strategy=3)
    rule = tailtrain.strategy("k-sync:k=1")
    record = tailtrain.train_own_model(**parts, strategy=rule, workers=2, iterations=3, lr=0.5)
    assert type(record) is tailtrain.RunRecord and len(record.steps) == 3
    assert record.summary["strategy"] == rule.describe()
    module = torch.nn.Linear(2, 2)
    vector_to_parameters(torch.as_tensor(record.theta), module.parameters())
    x, y = own_data()
    with torch.no_grad():
        loss = float(F.cross_entropy(module(x), y))
    assert loss == pytest.approx(record.evals[-1]["train_loss"], rel=1e-6)
    assert record.evals[-1]["train_loss"] != pytest.approx(record.evals[0]["train_loss"])


def test_advise_reads_a_trace_and_names_the_slow_worker(tmp_path):
    rng = np.random.default_rng(0)
    times = rng.lognormal(0.0, 0.3, (60, 4))
    times[:, 2] *= 3  # worker 2 is always slow
    rows = [f"{i},{w},{times[i, w]:.6f}" for i in range(60) for w in range(4)]
    trace = tmp_path / "trace.csv"
    trace.write_text("iteration,worker,seconds\n" + "\n".join(rows) + "\n")
    found = tailtrain.advise(trace, samples=200)
    assert found.persistent == [2] and found.workers == 4
    assert found.recommendation


def test_train_refuses_a_folder_that_holds_a_run_unless_overwrite(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    scenario = tailtrain.Scenario(**SMALL)
    with pytest.raises(UsageError, match=r"already holds a run \(summary\.json\)"):
        tailtrain.train(scenario, "sync", out=tmp_path)


def test_advise_takes_every_option_the_internal_advise_takes():
    # the face's wrapper names each option; one it leaves out (as --comm-time once was) is
    # an option the CLI has and a library user cannot give
    internal = set(inspect.signature(tailtrain._internal("advise")).parameters) - {"path"}
    face = set(inspect.signature(tailtrain.advise).parameters) - {"trace"}
    assert internal == face


def test_the_face_charges_a_traces_recorded_noncompute_as_the_cli_does(tmp_path, capsys):
    """One resolution of T^c (``Scenario.with_replayed_comm``): simulate, compare and predict
    from the library charge a trace's recorded noncompute seconds, as the CLI does, unless
    ``comm_time`` says otherwise. Two workers, 1 s and 2 s a round, T^c 0.5 s: 2.5 s a round."""
    from tailtrain.cli import main

    lines = ["iteration,worker,seconds,noncompute"]
    for i in range(20):
        lines += [f"{i},0,1.0,1.5", f"{i},1,2.0,0.5"]
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    delay = f"trace:path={path}"
    scenario = tailtrain.Scenario(task="none", workers=2, delay=delay, iterations=10)
    record = tailtrain.simulate(scenario, "sync")
    assert record.summary["mean_iteration_time"] == pytest.approx(2.5, abs=1e-12)
    argv = ["simulate", "--task", "none", "--workers", "2", "--delay", delay, "--iterations"]
    assert main([*argv, "10", "--no-progress", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["mean_iteration_time"] == record.summary["mean_iteration_time"]
    (row,) = tailtrain.compare(scenario, "sync").rows()
    assert row["mean_iteration_time"] == pytest.approx(2.5, abs=1e-12)
    sync = next(r for r in tailtrain.predict(scenario, "sync").rows if r.strategy == "sync")
    assert sync.iteration_time == pytest.approx(2.5, abs=1e-12)
    told = dataclasses.replace(scenario, comm_time="0.25")  # comm_time overrides the trace
    assert tailtrain.simulate(told, "sync").summary["mean_iteration_time"] == pytest.approx(2.25)


#: a script that calls ``tailtrain.train`` as one rank of a torchrun job and pickles what
#: that rank got back to ``rank{RANK}.pkl`` in the folder it is given
TORCHRUN_SCRIPT = """
import os, pickle, sys
from pathlib import Path

import tailtrain

if __name__ == "__main__":
    strategy, workers, folder = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    scenario = tailtrain.Scenario(task="logreg", workers=workers, iterations=4)
    record = tailtrain.train(scenario, strategy, seed=0, timeout=60)
    (folder / f"rank{os.environ['RANK']}.pkl").write_bytes(pickle.dumps(record))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_records(tmp_path: Path, strategy: str, workers: int, ranks: int) -> list:
    """What ``tailtrain.train`` returned on each rank of a ``ranks``-process torchrun job
    (gloo, c10d rendezvous on a free loopback port)."""
    script = tmp_path / "train_rank.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
        str(script), strategy, str(workers), str(tmp_path),
    ]  # fmt: skip
    # ~10 s alone; CI's other worker may run a 6-rank job beside it on the 2 cores
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    return [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(ranks)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("strategy", "workers", "ranks"),
    [
        ("sync", 2, 2),  # allreduce: rank 1 held rows of its own, no evaluations, no summary
        pytest.param("k-sync:k=2", 2, 3, marks=pytest.mark.slow),  # rank 0 serves 2 workers
    ],
)
def test_train_under_torchrun_returns_the_jobs_record_on_every_rank(
    tmp_path, strategy, workers, ranks
):
    """Under torchrun each rank's ``train`` returns to its own script: every one gets a
    ``RunRecord``, as ``simulate`` returns, with rank 0's steps, evaluations and summary
    (rank 1 once got a summary without ``mean_iteration_time``), and its own parameters."""
    records = torchrun_records(tmp_path, strategy, workers, ranks)
    lead = records[0]
    assert {type(r) for r in records} == {tailtrain.RunRecord}
    assert {"mean_iteration_time", "final_loss", "wall_time"} <= set(lead.summary)
    assert len(lead.steps) == 4 and lead.evals
    for record in records[1:]:
        assert clean(record.summary) == clean(lead.summary)
        assert clean(record.steps) == clean(lead.steps)
        assert clean(record.evals) == clean(lead.evals)
    if strategy == "sync":  # every rank applies the same updates: the same parameters
        assert lead.theta is not None and all(np.array_equal(r.theta, lead.theta) for r in records)
    else:  # the server's model; its workers hold none
        assert lead.theta is not None and [r.theta for r in records[1:]] == [None] * workers
