"""``advise --for ddp``'s edits, applied by the one applier to the loop shapes it names, train
(two gloo ranks run each patched script as a user would: ``python script.py``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tailtrain
from tailtrain.advice.adopt import adoption, probe_adoption
from tailtrain.advice.patch import apply_edits, unified_diff
from tailtrain.errors import UsageError

LOOPS = Path(__file__).parent / "loops"
ROOT = Path(__file__).resolve().parents[2]
SHAPES = ("one_batch", "trainer", "accumulate")
N = 2
EXIT_ABORT = "terminate called without an active exception"  #: see ``train``
SHARES = (24, 8)  # the per-rank batch of 16 on 2 ranks, dealt 3:1
BATCH = {"accumulate": 8}  # the per-rank loader batch (16 elsewhere)


def edits(strategy: str, shape: str = "one_batch") -> list[dict]:
    if strategy == "sync":
        return adoption("sync", "sync", "ddp").edits()
    if strategy == "dropcompute":
        return adoption("dropcompute:threshold=auto", "dropcompute", "ddp", 4).edits()
    shares = tuple(s * BATCH.get(shape, 16) // 16 for s in SHARES)
    return adoption("rebalance", "rebalance", "ddp", None, shares).edits()


def edits_shares(shape: str) -> tuple[int, ...]:
    return tuple(s * BATCH.get(shape, 16) // 16 for s in SHARES)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train(script: Path, out: Path) -> list[dict]:
    """Run ``script`` on N gloo ranks; each rank's saved model and step count."""
    src = str(Path(tailtrain.__file__).parents[1])
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(N),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(out)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(N)
    ]
    try:
        logs = [p.communicate(timeout=120)[0] for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    # torch's abort at exit, as bench/bench_loop.py's EXIT_ABORT says why: 2 and 4 of 64 runs
    # of these cases on two trees (3c8b642, 00e043e). A rank that saved its model had finished.
    finished = [
        p.returncode == 0 or (log.strip() == EXIT_ABORT and (out / f"rank{r}.pt").exists())
        for r, (p, log) in enumerate(zip(ranks, logs, strict=True))
    ]
    assert all(finished), logs
    return [torch.load(out / f"rank{r}.pt") for r in range(N)]


def test_sync_changes_nothing_and_says_keep_your_loop():
    found = adoption("sync", "sync", "ddp")
    assert found.lines() == ["# keep your loop as it is: sync is what it runs"]
    source = (LOOPS / "one_batch.py").read_text()
    assert apply_edits(source, found.edits()) == source


@pytest.mark.parametrize("shape", SHAPES)
def test_rebalance_inserts_the_two_lines_after_the_loader_and_the_ddp_model(shape):
    # runs on the ranks once rebalance_loader is importable (test below)
    source = (LOOPS / f"{shape}.py").read_text()
    patched = apply_edits(source, edits("rebalance", shape))
    compile(patched, shape, "exec")
    added = [
        line[1:].strip()
        for line in unified_diff(source, patched, shape).splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    owner = "self." if shape == "trainer" else ""
    loader, ddp = (f"{owner}train_data", f"{owner}model") if owner else ("loader", "ddp")
    # a plain ``ddp`` goes before the group is destroyed (a DDP model with a comm hook that
    # outlives its group can hang the exit); a Trainer's ``self.model`` is out of reach there
    teardown = (
        []
        if owner
        else ["del ddp  # a DDP model with a comm hook must go before its process group"]
    )
    assert added == [
        "from tailtrain import rebalance_loader, sample_weighted_hook",
        f"{loader} = rebalance_loader({loader}, shares={list(edits_shares(shape))})",
        f"{ddp}.register_comm_hook({loader}.batch_sampler, sample_weighted_hook)",
        *teardown,
    ]
    lines = patched.splitlines()
    if teardown:
        at_end = lines.index(next(line for line in lines if line.strip() == teardown[0]))
        assert "destroy_process_group()" in lines[at_end + 1]
    at = {text: next(i for i, line in enumerate(lines) if line.strip() == text) for text in added}
    assert at[added[1]] < at[added[2]]  # the hook holds the rebalanced loader's sampler
    assigned = "train_data" if shape == "trainer" else "DataLoader("  # the tutorial's helper
    assert lines[at[added[1]] - 1].strip().startswith(f"{loader} = {assigned}")


@pytest.mark.parametrize("strategy", ["rebalance", "dropcompute"])
def test_the_probes_lines_then_the_remedy_apply_to_the_tutorial_shape(strategy):
    # the README's loop: paste the probe, advise, paste the remedy into the probed script;
    # the probe lives beside the DDP model, as the hook state does, so every method sees it
    source = (LOOPS / "trainer.py").read_text()
    probed = apply_edits(source, probe_adoption("runs/probe").edits())
    assert '        self.probe = StragglerProbe("runs/probe").watch(self.model)' in probed
    assert "for source, targets in self.probe.batches(self.train_data):" in probed
    patched = apply_edits(probed, edits(strategy, "trainer"))
    compile(patched, "trainer", "exec")
    if strategy == "rebalance":
        assert "self.train_data = rebalance_loader(self.train_data, shares=[24, 8])" in patched
    else:
        assert "in self.state.micro_batches(self.model, list(zip(source.chunk(4)" in patched
    assert "self.probe.batches(self.train_data)" in patched


def test_the_hook_goes_after_the_rebalanced_loader_when_ddp_comes_first():
    source = (LOOPS / "one_batch.py").read_text()
    moved = source.replace("    model = nn.Linear(4, 2)\n    ddp = DDP(model)\n", "")
    moved = moved.replace(
        "    sampler = Dist",
        "    model = nn.Linear(4, 2)\n    ddp = DDP(model)\n    sampler = Dist",
    )
    lines = apply_edits(moved, edits("rebalance")).splitlines()
    deal = lines.index("    loader = rebalance_loader(loader, shares=[24, 8])")
    assert (
        lines[deal + 1] == "    ddp.register_comm_hook(loader.batch_sampler, sample_weighted_hook)"
    )


@pytest.mark.parametrize("shape", ["one_batch", "trainer"])
def test_dropcompute_names_the_micro_batches_apart_from_the_batch(shape):
    """The step's forward runs on names of its own, so the loop's batch names still hold the
    whole batch after the micro-batch loop (a ``len(x)`` there counted one micro-batch)."""
    patched = apply_edits((LOOPS / f"{shape}.py").read_text(), edits("dropcompute", shape))
    x, y = ("x", "y") if shape == "one_batch" else ("source", "targets")
    loop = f"for x_micro, y_micro in {'self.' if shape == 'trainer' else ''}state.micro_batches("
    assert loop in patched and f"zip({x}.chunk(4), {y}.chunk(4))" in patched
    body = patched[patched.index(loop) :].split("\n")[1:3]
    assert "x_micro" in body[0] + body[1] and f"({x})" not in "".join(body)
    compile(patched, shape, "exec")


def test_the_micro_batch_names_reach_keyword_arguments_and_leave_keywords_alone():
    """``ddp(input=x)``: the forward must see the micro-batch (the whole batch M times over
    would be M times the compute and another gradient), and ``input`` stays a keyword."""
    source = (LOOPS / "one_batch.py").read_text()
    keyword = source.replace("F.mse_loss(ddp(x), y)", "F.mse_loss(ddp(input=x), target=y)")
    assert keyword != source
    patched = apply_edits(keyword, edits("dropcompute"))
    assert "loss = F.mse_loss(ddp(input=x_micro), target=y_micro)" in patched
    compile(patched, "one_batch", "exec")


def test_dropcompute_refuses_a_loop_that_accumulates_under_no_sync():
    source = (LOOPS / "accumulate.py").read_text()
    with pytest.raises(UsageError, match="accumulates gradients under no_sync"):
        apply_edits(source, edits("dropcompute"))


@pytest.mark.parametrize("strategy", ["dropcompute", "rebalance"])
def test_a_loop_with_a_grad_scaler_is_told_to_propagate_overflows(strategy):
    """The printed lines screen a non-finite gradient out, which a GradScaler must see: the
    edits refuse such a loop in one line that says what to add."""
    source = (LOOPS / "one_batch.py").read_text()
    scaled = source.replace(
        "            loss.backward()\n            optimizer.step()\n",
        "            scaler.scale(loss).backward()\n            scaler.step(optimizer)\n"
        "            scaler.update()\n",
    ).replace("    steps = 0\n", "    steps = 0\n    scaler = torch.amp.GradScaler()\n")
    assert scaled.count("scaler") == 4
    with pytest.raises(UsageError, match='on_nonfinite="propagate"') as refused:
        apply_edits(scaled, edits(strategy))
    assert "\n" not in str(refused.value)


def test_an_unsupported_script_gets_one_line():
    with pytest.raises(UsageError, match="not a loop shape"):
        apply_edits("import torch\nprint(1)\n", edits("rebalance"))


RUNS = [(s, "sync") for s in SHAPES] + [(s, "dropcompute") for s in ("one_batch", "trainer")]
RUNS += [(s, "rebalance") for s in SHAPES]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("shape", "strategy"), RUNS)
def test_the_patched_script_trains_on_two_ranks(shape, strategy, tmp_path):
    if strategy == "rebalance" and not hasattr(tailtrain, "rebalance_loader"):
        pytest.skip("rebalance_loader is not in this tree yet (issue 34's DDP rebalance)")
    script = tmp_path / f"{shape}.py"
    script.write_text(apply_edits((LOOPS / f"{shape}.py").read_text(), edits(strategy, shape)))
    out = tmp_path / "out"
    out.mkdir()
    ranks = train(script, out)
    steps = {"accumulate": 8}.get(shape, 8)  # 128 samples / 2 ranks / 16 (or 2 x 8) x 2 epochs
    assert [r["steps"] for r in ranks] == [steps] * N
    for name, value in ranks[0]["model"].items():
        assert torch.isfinite(value).all()
        assert torch.equal(value, ranks[1]["model"][name])  # one model: the ranks reduced
    torch.manual_seed(0)
    start = torch.nn.Linear(4, 2).state_dict()
    assert not torch.equal(start["weight"], ranks[0]["model"]["weight"])  # it trained


def test_a_script_without_a_teardown_takes_the_remedy_without_the_del():
    """``del ddp`` goes before ``destroy_process_group()`` only where there is one: a script
    that never destroys its group still takes the two lines, not a one-line refusal."""
    source = (LOOPS / "one_batch.py").read_text().replace("    dist.destroy_process_group()\n", "")
    patched = apply_edits(source, edits("rebalance", "one_batch"))
    assert "rebalance_loader(" in patched and "del ddp" not in patched


TEARDOWN = "    dist.destroy_process_group()\n"


@pytest.mark.parametrize(
    "where",
    [
        # PyTorch's DDP tutorial's helper: ``ddp`` is not a name there
        ("def cleanup():\n    dist.destroy_process_group()\n\n\n", "    cleanup()\n"),
        # after main(), at module level, where ``ddp`` is not assigned
        ("", ""),
    ],
    ids=["helper", "main-block"],
)
def test_del_ddp_goes_only_where_ddp_is_assigned_before_the_teardown(where):
    """A teardown where the DDP model's name does not reach gets no ``del ddp`` (it would
    raise there): the remedy's lines still apply, and the patched script compiles."""
    helper, call = where
    source = (LOOPS / "one_batch.py").read_text().replace(TEARDOWN, call)
    source = source.replace("\ndef main()", f"\n{helper}def main()")
    if not helper:
        source = source.replace("    main()\n", "    main()\n    dist.destroy_process_group()\n")
    patched = apply_edits(source, edits("rebalance", "one_batch"))
    compile(patched, "one_batch", "exec")
    assert "rebalance_loader(" in patched and "del ddp" not in patched


def test_del_ddp_keeps_the_rest_of_the_teardown_line():
    source = (
        (LOOPS / "one_batch.py")
        .read_text()
        .replace(TEARDOWN, '    dist.destroy_process_group(); print("done")  # bye\n')
    )
    patched = apply_edits(source, edits("rebalance", "one_batch"))
    lines = patched.splitlines()
    at = lines.index('    dist.destroy_process_group(); print("done")  # bye')
    assert lines[at - 1].startswith("    del ddp  # ")


def test_a_script_that_already_deletes_its_ddp_model_gets_no_second_del():
    """``examples/probe_ddp.py`` has ``del ddp`` before its teardown: a second one raised
    ``UnboundLocalError`` at the end of the README's adopted run."""
    source = (LOOPS / "one_batch.py").read_text().replace(TEARDOWN, "    del ddp\n" + TEARDOWN)
    patched = apply_edits(source, edits("rebalance", "one_batch"))
    assert "rebalance_loader(" in patched and patched.count("del ddp") == 1
    example = (ROOT / "examples" / "probe_ddp.py").read_text()
    patched = apply_edits(example, edits("rebalance", "one_batch"))
    assert "rebalance_loader(" in patched and patched.count("del ddp") == 1
