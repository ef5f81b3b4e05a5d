"""A job across nodes (``runtime.launching.nodes``): "nodes" are launchers, each in a session
of its own, meeting at a store on 127.0.0.2 (loopback only), 2-3 nodes of 2 ranks, gloo.

Checked: the one-line refusals; a store that listens on its address only; the meeting (one
run id, a node's second start counted); what the launcher says (only what holds); and, end to
end with ``examples/shrink_loop.py`` (through ``node_drill.py`` for the drills a rank's own
SIGKILL cannot stage), in three jobs of 3 nodes x 2 ranks, several drills each so that CI
pays few process start-ups: a node SIGSTOPped past the learned deadline and continued
(refused) with a death inside that census taking its node out whole; the first node's death
and another's in the same step with the store apart; a node started again that heals from a
live peer while a rank of another node dies inside the heal; and in a job of 2 nodes, a node
whose launcher the user starts again by hand after its machine died (it heals) and then once
more (a --node-rank given twice: refused). After each, the survivors' parameters equal a
reference rebuilt from their records (which ranks entered each step)."""

from __future__ import annotations

import concurrent.futures
import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from tests.integrate.test_shrink_step import example, matches_reference, rebuilt

from tailtrain.errors import UsageError
from tailtrain.runtime.launching.endpoint import Endpoint
from tailtrain.runtime.launching.nodes import (
    BEAT,
    GroupBy,
    Nodes,
    StoreAt,
    await_job_end,
    beats,
    check_nodes,
    host_store,
    meet,
    node_env,
)

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "shrink_loop.py"  # its model, data and reference: test_shrink_step
DRILL = Path(__file__).with_name("node_drill.py")  # the example with drills a kill cannot stage
SPAN = datetime.timedelta(seconds=20)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ---- refusals and the meeting ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((0, 0, "launcher", None, 29500), "--nnodes must be >= 1"),
        ((2, 2, "launcher", None, 29500), "--node-rank must be in 0..1"),
        ((2, 0, "nowhere", None, 29500), "--store must be one of launcher, apart"),
        ((2, 0, "launcher", "rack", 29500), "--group-by must be one of node, rank"),
        ((2, 1, "launcher", None, 0), "needs a port every node can be told"),
        ((1, 0, "apart", None, 0), "needs a port every node can be told"),
        ((1, 0, "launcher", "node", 0), "the node is the whole job"),
    ],
)
def test_node_options_are_refused_in_one_line(args, says):
    nnodes, node_rank, store, group_by, port = args
    with pytest.raises(UsageError, match=says) as caught:
        check_nodes(nnodes, node_rank, store, group_by, Endpoint("127.0.0.2", port))
    assert "\n" not in str(caught.value)


def test_a_node_is_the_unit_across_nodes_and_a_rank_on_one():
    assert check_nodes(2, 1, "launcher", None, Endpoint("h", 1)).group_by is GroupBy.NODE
    assert check_nodes(1, 0, "launcher", None, Endpoint("h", 0)).group_by is GroupBy.RANK
    assert check_nodes(2, 0, "apart", "rank", Endpoint("h", 1)).group_by is GroupBy.RANK


def test_ranks_are_numbered_as_torchrun_numbers_them():
    env = node_env(Nodes(3, 2), nproc=2, local=1)
    assert env["RANK"] == "5" and env["LOCAL_RANK"] == "1" and env["GROUP_RANK"] == "2"
    assert env["WORLD_SIZE"] == "6" and env["LOCAL_WORLD_SIZE"] == "2"


@pytest.mark.timeout(60)
def test_the_store_listens_on_its_address_only():
    store = host_store(Endpoint("127.0.0.2", 0), SPAN)
    with socket.create_connection(("127.0.0.2", store.port), timeout=5):
        pass
    with pytest.raises(OSError), socket.create_connection(("127.0.0.3", store.port), timeout=5):
        pass


@pytest.mark.timeout(60)
def test_launchers_meet_on_one_run_id_and_count_a_node_started_again():
    port = free_port("127.0.0.2")
    host = meet(Nodes(2, 0, StoreAt.LAUNCHER, GroupBy.NODE), Endpoint("127.0.0.2", port), SPAN)
    other = Nodes(2, 1, StoreAt.LAUNCHER, GroupBy.NODE)
    first = meet(other, Endpoint("127.0.0.2", port), SPAN)
    again = meet(other, Endpoint("127.0.0.2", port), SPAN)  # node 1's machine came back
    assert host.run_id == first.run_id == again.run_id
    assert (host.restarts, first.restarts, again.restarts) == (0, 0, 1)
    assert host.store.add(first.key("starts/1"), 0) == 1  # a second start counts once confirmed
    again.confirm()  # node 1's first launcher never beat: gone
    assert host.store.add(first.key("starts/1"), 0) == 2
    host.ended(finished=False)  # node 0's ranks died: its store still serves node 1
    first.ended(finished=False)  # node 1's first start: not the node's end, it started again
    ends = lambda: await_job_end(host.store, host.run_id, 2, timeout=30, asked=lambda: False)  # noqa: E731
    began = time.monotonic()
    waiter = concurrent.futures.ThreadPoolExecutor(1).submit(ends)
    time.sleep(1.0)
    assert not waiter.done()
    again.ended(finished=True)  # node 1's latest start ended
    assert waiter.result(timeout=10) == "every node ended or was lost (2 nodes)"
    assert time.monotonic() - began < 10


@pytest.mark.timeout(60)
def test_the_store_s_host_counts_a_silent_node_as_lost_and_ends_after_the_job_finished():
    port = free_port("127.0.0.2")
    host = meet(Nodes(3, 0, StoreAt.LAUNCHER, GroupBy.NODE), Endpoint("127.0.0.2", port), SPAN)
    beating = meet(Nodes(3, 1, StoreAt.LAUNCHER, GroupBy.NODE), Endpoint("127.0.0.2", port), SPAN)
    host.ended(finished=True)
    done = threading.Event()

    def beat() -> None:  # node 1 beats on (every BEAT s); node 2 never did: a machine lost
        while not done.is_set():
            beating.beat()
            time.sleep(0.05)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        line = await_job_end(host.store, host.run_id, 3, timeout=2.5, asked=lambda: False)
    finally:
        done.set()
    assert line == "nodes [1] still ran --timeout 2.5s after the job finished"
    interrupted = await_job_end(host.store, host.run_id, 3, timeout=30, asked=lambda: True)
    assert interrupted == "interrupted"


@pytest.mark.timeout(60)
def test_a_launcher_with_no_store_to_meet_says_so_in_one_line():
    port = free_port("127.0.0.2")
    span = datetime.timedelta(seconds=2)
    with pytest.raises(UsageError, match="no store answered") as caught:
        meet(Nodes(2, 1), Endpoint("127.0.0.2", port), span)
    assert "\n" not in str(caught.value)


# ---- end to end: examples/shrink_loop.py on loopback nodes ---------------------------------------
def environment() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def launcher(
    node: int,
    nnodes: int,
    port: int,
    out: Path,
    extra: list[str],
    store: str = "launcher",
    script: Path = EXAMPLE,
) -> list[str]:
    return [
        sys.executable, "-m", "tailtrain", "launch", "--nnodes", str(nnodes),
        "--node-rank", str(node), "--nproc-per-node", "2", "--store", store,
        "--rdzv-endpoint", f"127.0.0.2:{port}", "--on-rank-loss", "shrink", "--timeout", "120",
        *extra, str(script), "--steps", "12", "--out", str(out),
    ]  # fmt: skip


def run_nodes(
    nnodes: int,
    out: Path,
    args: list[str],
    store: str = "launcher",
    launch: list[str] = (),
    script: Path = EXAMPLE,
    node_launch: dict[int, list[str]] | None = None,
) -> tuple[list[subprocess.CompletedProcess], subprocess.CompletedProcess | None]:
    """Every node's launcher (and ``tailtrain store`` with ``store="apart"``), each a session of
    its own, as on its own machine; their outcomes once all ended (bounded). ``launch``: every
    launcher's own options; ``node_launch``: one node's, besides."""
    port, env = free_port("127.0.0.2"), environment()
    apart = None
    if store == "apart":
        command = [sys.executable, "-m", "tailtrain", "store", "--nnodes", str(nnodes)]
        # a node lost once silent 15 s: the store ends soon after the job (its end is waited for)
        command += ["--rdzv-endpoint", f"127.0.0.2:{port}", "--timeout", "15"]
        apart = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
    procs = []
    for i in range(nnodes):  # a session each: a node's launcher and ranks go as one
        extra = [*launch, *(node_launch or {}).get(i, [])]
        command = launcher(i, nnodes, port, out, extra, store, script) + args
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, **pipes)
        procs.append(process)
    done = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    kept = None
    if apart is not None:
        _, stderr = apart.communicate(timeout=60)
        kept = subprocess.CompletedProcess(apart.args, apart.returncode, "", stderr)
    return done, kept


def kept_ranks(out: Path, ranks: range) -> dict[int, dict]:
    files = {r: out / f"rank{r}.pt" for r in ranks}
    return {r: torch.load(f, weights_only=False) for r, f in files.items() if f.exists()}


def survivors_agree(kept: dict[int, dict], survivors: list[int], world: int) -> list[dict]:
    """The survivors' records are one; their parameters are equal, and equal the reference
    rebuilt from the records; returns the records."""
    assert sorted(kept) == survivors
    records = kept[survivors[0]]["records"]
    assert all(kept[r]["records"] == records for r in survivors)
    models = [kept[r]["model"] for r in survivors]
    for name, value in models[0].items():
        assert all(torch.equal(value, other[name]) for other in models[1:]), name
    matches_reference(models[0], lambda rows: rebuilt(example(), rows, world), records)
    return records


AT = 4  # the step a drill strikes in (of the example's 12)


@pytest.mark.slow  # 3 launchers, 6 ranks and the store
@pytest.mark.timeout(300)
def test_the_first_node_and_another_lost_in_one_step_leave_the_job_going_with_the_store_apart(
    tmp_path,
):
    """Nodes 0 and 1 die in the same step, their machines whole (each launcher SIGKILLed, its
    ranks with it: nothing notes them dead); node 2's ranks regroup and finish; the store,
    apart, ends once the last launcher said so."""
    args = ["--kill-rank", "0", "2", "--kill-step", str(AT), "--kill-what", "node"]
    done, store = run_nodes(3, tmp_path, args, store="apart")
    assert done[0].returncode == done[1].returncode == -9  # their launchers were killed
    assert done[2].returncode == 0, done[2].stderr[-3000:]
    records = survivors_agree(kept_ranks(tmp_path, range(6)), [4, 5], world=6)
    assert [r["live"] for r in records[AT:]] == [[4, 5]] * (12 - AT)
    # both nodes lost at the one step they died in, by one regroup (two censuses at most)
    assert [(r["step"], r["lost"], r["redone"]) for r in records if r["lost"]] == [
        (AT, [0, 1, 2, 3], True)
    ]
    assert store is not None and store.returncode == 0, store.stderr[-2000:]
    assert "a c10d store is unauthenticated" in store.stderr


@pytest.mark.slow  # 2 launchers and 4 ranks; node 1's launcher started twice more by hand
@pytest.mark.timeout(300)
def test_a_node_started_again_by_hand_heals_and_its_node_rank_given_twice_is_refused(tmp_path):
    """Node 1's machine dies in step AT (its launcher SIGKILLed, its ranks with it), and the
    user starts its launcher again: its ranks import while it looks at the node's earlier
    beats, ask to join once it cleared them, and heal from a live peer. Once they are back,
    the user gives --node-rank 1 a third time: that launcher is refused in one line, exit 2,
    and its ranks, started while it looked, never touch the job (the records name no third
    join, and every rank's parameters equal the reference rebuilt from them)."""
    port, env = free_port("127.0.0.2"), environment()
    args = ["--kill-rank", "2", "--kill-step", str(AT), "--kill-what", "node"]
    args += ["--rejoin-steps", "200"]  # the survivors go on long enough for the third start

    started: list[subprocess.Popen] = []

    def start(node: int) -> subprocess.Popen:
        command = launcher(node, 2, port, tmp_path, []) + args
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, **pipes)
        started.append(process)
        return process

    first, killed = start(0), start(1)
    try:
        assert killed.wait(timeout=120) == -9  # node 1's machine died
        again = start(1)
        said: list[str] = []
        back = threading.Event()

        def read() -> None:
            for line in again.stderr:
                said.append(line)
                if "rejoined the live ranks" in line:
                    back.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert back.wait(timeout=120), "".join(said)[-3000:]
        twice = start(1)
        _, refused = twice.communicate(timeout=120)
        assert twice.returncode == 2, refused[-3000:]
        assert refused == (
            "tailtrain launch: error: node 1 of this job is running (its launcher beats): give "
            "each launcher its own --node-rank\n"
        )
        assert again.wait(timeout=120) == 0, "".join(said)[-3000:]
        reader.join(timeout=10)
        _, stderr = first.communicate(timeout=120)
        assert first.returncode == 0, stderr[-3000:]
    finally:  # a failed assertion leaves no node behind
        for p in started:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    kept = kept_ranks(tmp_path, range(4))
    assert sorted(kept) == [0, 1, 2, 3]
    records = kept[0]["records"]
    rejoins = [(row["step"], row["rejoined"]) for row in records if row["rejoined"]]
    assert len(rejoins) == 1 and rejoins[0][1] == [2, 3]  # node 1 whole, once
    assert kept[1]["records"] == records
    assert all(kept[r]["records"] == records[rejoins[0][0] :] for r in (2, 3))
    models = [kept[r]["model"] for r in range(4)]
    for name, value in models[0].items():
        assert all(torch.equal(value, other[name]) for other in models[1:]), name
    matches_reference(models[0], lambda rows: rebuilt(example(), rows, 4), records)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["store", "--rdzv-endpoint", "127.0.0.2:0", "--nnodes", "2"], "not 0"),
        (["store", "--rdzv-endpoint", "127.0.0.2:29400", "--nnodes", "0"], "--nnodes must be"),
        (["launch", "--nnodes", "2", "--node-rank", "1", str(EXAMPLE)], "needs a port"),
        (["launch", "--nnodes", "2", "--node-rank", "3", str(EXAMPLE)], "--node-rank must be"),
    ],
)
def test_bad_node_options_are_one_line_and_status_2_before_any_process(argv, says, capsys):
    from tailtrain.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


@pytest.mark.timeout(60)
def test_under_stop_a_node_that_failed_stops_the_other_nodes_ranks():
    """torchrun's policy across nodes (``--on-rank-loss stop``): one node's failure is said in
    the store, and every other launcher stops its ranks with a line naming it."""
    import torch.distributed as dist

    from tailtrain.runtime.elastic.shrink import OnRankLoss
    from tailtrain.runtime.launching.failures import JobFailed
    from tailtrain.runtime.launching.scripts import Rank, watch

    port = free_port("127.0.0.2")
    host = meet(Nodes(2, 0, StoreAt.LAUNCHER, GroupBy.NODE), Endpoint("127.0.0.2", port), SPAN)
    other = meet(Nodes(2, 1, StoreAt.LAUNCHER, GroupBy.NODE), Endpoint("127.0.0.2", port), SPAN)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    other.stop_others("rank 3 failed (exit status 1); the other ranks were stopped")
    notes = dist.PrefixStore("shrink", host.store)
    with pytest.raises(JobFailed, match=r"^another node failed \(rank 3 failed"):
        watch([Rank(0, sleeper)], OnRankLoss.STOP, notes, [], timeout=30, shared=host)
    assert sleeper.poll() is not None


@pytest.mark.timeout(60)
def test_a_launcher_whose_options_differ_or_whose_node_runs_is_refused_in_one_line():
    port = free_port("127.0.0.2")
    where = Endpoint("127.0.0.2", port)
    host = meet(Nodes(2, 0, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN, nproc=2)
    with pytest.raises(UsageError, match="this job runs --nnodes 2 --nproc-per-node 2") as caught:
        meet(Nodes(2, 1, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN, nproc=4)
    assert "\n" not in str(caught.value)
    running = meet(Nodes(2, 1, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN, nproc=2)
    done = threading.Event()

    def beat() -> None:
        while not done.is_set():
            running.beat()
            time.sleep(0.05)

    threading.Thread(target=beat, daemon=True).start()
    try:
        twice = meet(Nodes(2, 1, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN, nproc=2)
        assert twice.clearance() == "cleared/1/1"  # its ranks would wait for it
        with pytest.raises(UsageError, match="node 1 of this job is running") as caught:
            twice.confirm()
        assert "\n" not in str(caught.value)
    finally:
        done.set()
    assert host.run_id == running.run_id
    assert host.store.add(running.key("starts/1"), 0) == 1  # the refused start taken back
    assert running.clearance() is None  # a first start has no look to wait for


@pytest.mark.timeout(60)
def test_of_two_second_starts_of_a_node_at_once_one_is_refused_and_counts_nothing():
    port = free_port("127.0.0.2")
    where = Endpoint("127.0.0.2", port)
    host = meet(Nodes(2, 0, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN)
    meet(Nodes(2, 1, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN)  # its machine died since
    a, b = (meet(Nodes(2, 1, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN) for _ in range(2))
    assert a.restarts == b.restarts == 1 and a.clearance() == b.clearance()
    a.confirm()
    with pytest.raises(UsageError, match="node 1 of this job was started again by another"):
        b.confirm()
    assert host.store.add(a.key("starts/1"), 0) == 2  # a's start only


@pytest.mark.timeout(30)
def test_a_launcher_that_beats_is_alive_and_one_that_stopped_beating_is_not():
    store = torch.distributed.HashStore()
    assert not beats(store, "beat/1")  # never beat: a node whose machine died
    done = threading.Event()

    def beat(times: int | None) -> None:
        while not done.is_set() and (times is None or (times := times - 1) >= 0):
            store.add("beat/2", 1)
            time.sleep(BEAT)

    threading.Thread(target=beat, args=(None,), daemon=True).start()
    try:
        assert beats(store, "beat/2")
    finally:
        done.set()
    time.sleep(2 * BEAT)  # its last beat is behind it
    assert not beats(store, "beat/2")  # beat, then stopped: a launcher killed


@pytest.mark.timeout(60)
def test_a_launcher_beats_from_its_meeting_until_it_ends():
    """``keep_beating``'s thread says the launcher is alive while its main thread does other
    things (here: nothing at all), so a second start of its node is refused; once it ended,
    a second start goes ahead as a restart."""
    port = free_port("127.0.0.2")
    where = Endpoint("127.0.0.2", port)
    host = meet(Nodes(2, 0, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN)
    first = meet(Nodes(2, 1, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN)
    first.keep_beating(where)
    with pytest.raises(UsageError, match="node 1 of this job is running"):
        meet(Nodes(2, 1, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN).confirm()
    first.ended(finished=False)
    time.sleep(2 * BEAT)  # a beat in flight lands
    again = meet(Nodes(2, 1, StoreAt.LAUNCHER, GroupBy.NODE), where, SPAN)
    again.confirm()  # looked ALIVE_LOOK s and saw no beat
    assert again.restarts == 1 and host.run_id == again.run_id


@pytest.mark.slow  # 3 launchers and 6 ranks
@pytest.mark.timeout(300)
def test_a_node_stopped_past_the_deadline_is_refused_and_a_death_in_that_census_takes_its_node(
    tmp_path,
):
    """Three drills in one job. Node 1 (its launcher and ranks 2, 3) is SIGSTOPped inside step
    4 until the others' census went on without it (they waited past the learned deadline),
    then continued; rank 5 dies inside that census after it checked in (counted alive), and
    its launcher takes node 2 out whole (rank 4 stopped). Node 0 goes on: step 4 is redone
    without the four, nothing of node 1's stale step enters an update (the parameters equal
    the reference rebuilt from the records), and node 1's ranks are refused when they wake.
    Each launcher says what holds, in one line: no node claims the others go on."""
    args = ["--stop-node", f"{AT}:2", "--die-in", "census:5"]
    done, _ = run_nodes(3, tmp_path, args, script=DRILL)
    assert done[0].returncode == 0, done[0].stderr[-3000:]
    assert "no answer within the deadline" in done[0].stderr  # a hang, not a failure
    assert f"ranks [0, 1] went on from step {AT} (generation " in done[0].stderr
    records = survivors_agree(kept_ranks(tmp_path, range(6)), [0, 1], world=6)
    assert [r["live"] for r in records] == [[0, 1, 2, 3, 4, 5]] * AT + [[0, 1]] * (12 - AT)
    assert [(r["step"], r["lost"], r["redone"]) for r in records if r["lost"]] == [
        (AT, [2, 3, 4, 5], True)
    ]
    stopped, lost = done[1], done[2]  # refused when they woke: they left, alive
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert f"rank 2 came after the census at step {AT}" in stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith("tailtrain launch: error: no rank finished: ranks [2, 3] left the job")
    assert lost.returncode == 1, lost.stderr[-3000:]
    line = "this node left the job: rank 5 died (killed by SIGKILL); ranks [4] of its node were"
    assert lost.stderr.count(line) == 1 and "go on without" not in lost.stderr


@pytest.mark.slow  # 3 launchers, 6 ranks, 2 of them started again
@pytest.mark.timeout(300)
def test_a_node_started_again_heals_while_a_rank_of_another_dies_in_the_heal(tmp_path):
    """Rank 2 dies in step 4; node 1's launcher stops rank 3 and starts both again
    (--restart-lost 1, on node 1 only); they ask to be taken in, and as the live ranks take
    them in rank 5 dies (inside the grow) and node 2 leaves whole. The heal's generation fails
    as it forms and the census runs again: node 1 is taken back whole and node 2 is lost at one
    step boundary, node 1 heals from a live peer, and every rank left ends equal, equal to the
    reference rebuilt from the records."""
    args = ["--kill-rank", "2", "--kill-step", str(AT), "--rejoin-steps", "4", "--die-in", "grow:5"]
    done, _ = run_nodes(3, tmp_path, args, script=DRILL, node_launch={1: ["--restart-lost", "1"]})
    for d in done[:2]:
        assert d.returncode == 0, d.stderr[-3000:]
    assert done[2].returncode == 1, done[2].stderr[-3000:]
    assert "this node left the job: rank 5 died (killed by SIGKILL)" in done[2].stderr
    assert "its node's ranks [2, 3] were started again (1 of 1)" in done[1].stderr
    kept = kept_ranks(tmp_path, range(6))
    assert sorted(kept) == [0, 1, 2, 3], done[1].stderr[-3000:]
    records = kept[0]["records"]
    assert kept[1]["records"] == records
    rejoins = {r: row["step"] for row in records for r in row["rejoined"]}
    assert sorted(rejoins) == [2, 3] and rejoins[2] == rejoins[3]  # the node whole, at once
    back = rejoins[2]
    for r in (2, 3):  # said by its launcher once the generation that took it in held
        assert f"rank {r} rejoined the live ranks at step {back} (generation " in done[1].stderr
        assert kept[r]["records"] == records[back:]
    assert [(r["step"], r["lost"]) for r in records if r["lost"]] == [(AT, [2, 3]), (back, [4, 5])]
    models = [kept[r]["model"] for r in range(4)]
    for name, value in models[0].items():
        assert all(torch.equal(value, other[name]) for other in models[1:]), name
    matches_reference(models[0], lambda rows: rebuilt(example(), rows, 6), records)
