"""``tailtrain launch`` (``runtime.launching.scripts``): its one-line refusals before any process
starts, and how it ends a job of tiny scripts (no torch in the ranks: each starts in a fraction of a
second): torchrun's stop by default, a death the job survives under shrink."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist

from tailtrain.cli import main
from tailtrain.errors import UsageError
from tailtrain.runtime.elastic.shrink import OnRankLoss
from tailtrain.runtime.launching import scripts
from tailtrain.runtime.launching.failures import JobFailed
from tailtrain.runtime.launching.scripts import Rank, RankState, check_launch, launch_script, watch

#: a rank's whole script: RANK 1 ends as its first argument says, the others after a while
SCRIPT = """\
import os, signal, sys, time
rank, how = int(os.environ["RANK"]), sys.argv[1]
assert os.environ["WORLD_SIZE"] == "3" and os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
if rank == 1 and how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if rank == 1 and how == "exit":
    sys.exit(3)
if rank == 1 and how == "hang":
    os.kill(os.getpid(), signal.SIGSTOP)
if rank == 1 and how == "refuse":
    import tailtrain
    raise tailtrain.UsageError("bad option x")
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


def test_bad_launches_are_refused_in_one_line(script):
    cases = {
        "^no script given: tailtrain launch": (None, 2, "stop"),
        "--nproc-per-node must be >= 1, got 0": (str(script), 0, "stop"),
        "--on-rank-loss must be one of stop, shrink, got 'grow'": (str(script), 2, "grow"),
        "no script 'nowhere.py'": ("nowhere.py", 2, "stop"),
    }
    for message, (path, n, loss) in cases.items():
        with pytest.raises(UsageError, match=message):
            check_launch(path, n, loss)
    with pytest.raises(UsageError, match="HOST:PORT"):
        check_launch(str(script), 2, "stop", endpoint="nowhere")
    with pytest.raises(UsageError, match="too many"):
        check_launch(str(script), 10_000, "stop")
    plan = check_launch(str(script), 3, "shrink", args=["kill", "0"])
    assert (plan.nproc, plan.on_rank_loss, plan.args) == (3, OnRankLoss.SHRINK, ("kill", "0"))


def test_the_command_line_says_one_line_and_exits_2(script, capsys):
    assert main(["launch", "--nproc-per-node", "0", str(script)]) == 2
    assert capsys.readouterr().err == (
        "tailtrain launch: error: --nproc-per-node must be >= 1, got 0\n"
    )
    with pytest.raises(SystemExit) as caught:  # an option of ours that does not exist
        main(["launch", "--bogus", str(script)])
    assert caught.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.timeout(60)
def test_the_script_s_own_options_pass_through_and_a_job_finishes(script, capsys):
    assert main(["launch", "--nproc-per-node", "3", str(script), "none", "0.0"]) == 0


@pytest.mark.timeout(60)
def test_under_stop_a_failed_rank_stops_the_others_and_fails_in_one_line(script, capsys):
    assert main(["launch", "--nproc-per-node", "3", str(script), "exit", "30"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "tailtrain launch: error: rank 1 failed (exit status 3); the other ranks were stopped\n"
    )


@pytest.mark.timeout(60)
def test_under_shrink_a_rank_s_bad_input_ends_the_job_in_one_line_and_is_never_restarted(
    script, capsys, caplog
):
    """A rank that refused its input is no death: under shrink with restarts left it is not
    started again (it was, as the bench across nodes found), and the launch exits 2 with its
    one line, once."""
    argv = ["launch", "--nproc-per-node", "3", "--on-rank-loss", "shrink", "--restart-lost", "1"]
    assert main([*argv, str(script), "refuse", "30"]) == 2
    assert capsys.readouterr().err == "job.py: error: bad option x\n"
    assert "died" not in caplog.text and "started again" not in caplog.text


@pytest.mark.timeout(60)
def test_under_shrink_a_killed_rank_is_noted_and_the_job_goes_on(script):
    plan = check_launch(str(script), 3, "shrink", args=["kill", "1.0"])
    outcome = launch_script(plan)
    assert outcome.states == {0: RankState.FINISHED, 1: RankState.DIED, 2: RankState.FINISHED}
    assert outcome.failure is None and not outcome.interrupted


@pytest.mark.timeout(60)
def test_under_shrink_a_job_where_no_rank_finished_fails(tmp_path, capsys):
    path = tmp_path / "fails.py"
    path.write_text("import sys\nsys.exit(1)\n")
    assert main(["launch", "--nproc-per-node", "2", "--on-rank-loss", "shrink", str(path)]) == 1
    # both exit at once: which the launcher sees first is the machine's to decide
    err = capsys.readouterr().err
    assert re.search(r"no rank finished: rank [01] failed first \(exit status 1\)", err), err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_ctrl_c_is_forwarded_to_every_rank_and_the_launch_says_it_was_interrupted(script, sig):
    plan = check_launch(str(script), 3, "shrink", args=["none", "600"])
    timer = threading.Timer(1.0, os.kill, (os.getpid(), sig))
    timer.start()
    try:
        outcome = launch_script(plan)  # the ranks would sleep 600 s
    finally:
        timer.cancel()
    assert outcome.interrupted
    assert set(outcome.states.values()) == {RankState.STOPPED}


@pytest.mark.timeout(60)
def test_a_rank_still_running_after_the_others_finished_is_stopped_at_the_timeout(script):
    plan = check_launch(str(script), 3, "shrink", timeout=1.0, args=["hang", "0"])
    outcome = launch_script(plan)  # rank 1 stopped itself (SIGSTOP): only SIGKILL ends it
    assert outcome.states == {0: RankState.FINISHED, 1: RankState.STOPPED, 2: RankState.FINISHED}
    plan = check_launch(str(script), 3, "stop", timeout=1.0, args=["hang", "0"])
    with pytest.raises(JobFailed, match=r"ranks \[1\] still ran 1s after the first rank finished"):
        launch_script(plan)


@pytest.mark.timeout(60)
def test_a_rank_that_left_and_exited_0_does_not_start_the_clock_on_the_survivors():
    """A loop that catches ``Refused`` exits 0 long before the survivors finish: it left (its
    ``left/{rank}`` says so), so the --timeout after the first finished rank is not started by
    it and the survivor still training is not stopped as a hung rank."""
    notes = dist.HashStore()
    notes.set("left/0", "rank 0 came after the census at step 5")
    ranks = [
        Rank(0, subprocess.Popen([sys.executable, "-c", "pass"])),
        Rank(1, subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])),
    ]
    outcome = watch(ranks, OnRankLoss.SHRINK, notes, [], timeout=0.3)
    assert outcome.states == {0: RankState.LEFT, 1: RankState.FINISHED}


@pytest.mark.timeout(60)
def test_a_port_taken_after_it_was_found_free_is_refused_in_one_line(script, monkeypatch):
    """Another process may bind the port between reserve()'s look and the store's bind: one
    line, before any rank starts, not the store's traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(scripts, "reserve", lambda endpoint: endpoint)  # it looked earlier
        plan = check_launch(str(script), 1, "stop", endpoint=f"127.0.0.1:{port}")
        with pytest.raises(UsageError, match=r"port \d+ is in use") as caught:
            launch_script(plan)
    assert "\n" not in str(caught.value)


def gone(pid: int) -> bool:
    """Whether process ``pid`` ended (a zombie no one reaped counts: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


@pytest.mark.timeout(60)
def test_ctrl_c_reaches_what_a_rank_started_too(tmp_path):
    """A rank's own child (a data loader's worker, a tool) gets the forwarded Ctrl-C with it,
    as it would from a terminal, instead of running on after the launch ended."""
    pids = tmp_path / "child.pid"
    path = tmp_path / "spawns.py"
    path.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    plan = check_launch(str(path), 1, "stop")
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        assert launch_script(plan).interrupted
    finally:
        timer.cancel()
    child = int(pids.read_text())
    end = time.monotonic() + 10.0
    while not gone(child) and time.monotonic() < end:
        time.sleep(0.05)
    alive = not gone(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive


@pytest.mark.timeout(60)
def test_under_shrink_the_failure_names_the_rank_that_failed_first_not_the_lowest(tmp_path):
    path = tmp_path / "fails.py"
    path.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '0':\n"
        "    time.sleep(1.0)\n"
        "sys.exit(4 if os.environ['RANK'] == '1' else 1)\n"
    )
    plan = check_launch(str(path), 2, "shrink")
    with pytest.raises(JobFailed, match=r"rank 1 failed first \(exit status 4\)"):
        launch_script(plan)


def test_restart_lost_is_refused_in_one_line_where_it_cannot_work(script, capsys):
    with pytest.raises(UsageError, match="--restart-lost must be >= 0, got -1"):
        check_launch(str(script), 3, "shrink", restart_lost=-1)
    with pytest.raises(UsageError, match="add --on-rank-loss shrink"):
        check_launch(str(script), 3, "stop", restart_lost=1)
    assert main(["launch", "--nproc-per-node", "3", "--restart-lost", "1", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tailtrain launch: error: --restart-lost 1 starts a dead rank again")
    assert err.count("\n") == 1
    assert check_launch(str(script), 3, "shrink", restart_lost=2).restart_lost == 2


@pytest.mark.timeout(60)
def test_a_killed_rank_is_started_again_at_most_n_times_with_its_rank_and_a_marker(
    tmp_path, caplog
):
    """Rank 1 SIGKILLs itself every time it starts: it is started again twice (the same RANK,
    ``TAILTRAIN_RESTART`` = 1, then 2), and its third death is the job's loss. No restart was
    ever taken in, so the launch fails with one line though the others finished: a heal that
    failed is a failure, not a job that "goes on"."""
    path = tmp_path / "dies.py"
    path.write_text(
        "import os, signal, sys, time\n"
        "rank, again = os.environ['RANK'], os.environ.get('TAILTRAIN_RESTART', '0')\n"
        "open(os.path.join(sys.argv[1], f'rank{rank}-{again}'), 'w').close()\n"
        "if rank == '1':\n"
        "    assert (again != '0') == (os.environ.get('TAILTRAIN_REJOIN') == '1')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        # the others finish once rank 1's last start is in (a restart comes before any finish)
        "last, end = os.path.join(sys.argv[1], 'rank1-2'), time.monotonic() + 30\n"
        "while not os.path.exists(last) and time.monotonic() < end:\n"
        "    time.sleep(0.01)\n"
        "time.sleep(0.5)\n"
    )
    plan = check_launch(str(path), 3, "shrink", args=[str(tmp_path)], restart_lost=2)
    failed = "the heal failed: rank 1 was started again and died before it was taken in"
    with (
        caplog.at_level("WARNING", logger="tailtrain.runtime.launching.scripts"),
        pytest.raises(JobFailed, match=f"^{failed} \\(killed by SIGKILL\\)$"),
    ):
        launch_script(plan)
    started = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("rank"))
    assert started == ["rank0-0", "rank1-0", "rank1-1", "rank1-2", "rank2-0"]
    lines = [r.getMessage() for r in caplog.records]
    assert [line for line in lines if "started again" in line] == [
        f"rank 1 died (killed by SIGKILL); started again ({k} of 2)" for k in (1, 2)
    ]
    # said: what holds; not said: that the job goes on, or that a restart rejoined
    assert "rank 1 died (killed by SIGKILL); noted dead for the live ranks" in lines
    assert not [line for line in lines if "goes on" in line or "rejoined" in line]


def sleeper(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


@pytest.mark.timeout(60)
def test_a_restart_is_said_to_have_rejoined_only_once_the_live_ranks_took_it_in(caplog):
    """``healed/{rank}`` is written by the generation that took the restart in, once it held
    (``Shrinker.held``): the launcher says "rejoined" then, not before, and the job is fine."""
    notes = dist.HashStore()
    back = Rank(1, sleeper(1.0), restarts=1)
    timer = threading.Timer(0.5, notes.set, ("healed/1", "[2, 12]"))
    timer.start()
    with caplog.at_level("WARNING", logger="tailtrain.runtime.launching.scripts"):
        outcome = watch([Rank(0, sleeper(1.5)), back], OnRankLoss.SHRINK, notes, [], timeout=30)
    timer.join()
    assert outcome.failure is None and outcome.states[1] is RankState.FINISHED
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["rank 1 rejoined the live ranks at step 12 (generation 2)"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [0, 1])
def test_a_restart_that_ends_before_it_was_taken_in_is_a_failed_heal(code):
    """A restart that exits, even with status 0, before any generation took it in: the heal
    failed, and the launch fails with one line naming it, though the other rank finished."""
    notes = dist.HashStore()
    ranks = [
        Rank(0, sleeper(1.0)),
        Rank(1, subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"]), restarts=1),
    ]
    how = "ended" if code == 0 else "died"
    line = f"^the heal failed: rank 1 was started again and {how} before it was taken in "
    with pytest.raises(JobFailed, match=line + rf"\(exit status {code}\)$"):
        watch(ranks, OnRankLoss.SHRINK, notes, [], timeout=30)


@pytest.mark.timeout(60)
def test_a_node_whose_restart_failed_leaves_in_one_line_that_says_the_heal_failed():
    """Across nodes (``by_node``): a restart of the node that dies before it was taken in, with
    no restart left, stops its node's other rank and fails the launch with one line naming the
    rank and the failed heal; nothing claims that the other nodes go on."""
    notes = dist.HashStore()
    ranks = [
        Rank(2, subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"]), restarts=1),
        Rank(3, sleeper(30), local=1, restarts=1),
    ]
    with pytest.raises(JobFailed) as caught:
        watch(ranks, OnRankLoss.SHRINK, notes, [], timeout=30, by_node=True)
    assert str(caught.value) == (
        "this node left the job: the heal failed: rank 2 was started again and died before it "
        "was taken in (exit status 1); ranks [3] of its node were stopped"
    )
    assert ranks[1].process.poll() is not None
    assert notes.check(["dead/2", "dead/3"])


def test_the_launcher_says_a_generation_went_on_only_once_it_held():
    """``gen{g}/held`` (written by the members of a generation that formed and synced) is said
    once; a generation whose forming failed (its census written, no ``held``) is passed over."""
    notes = dist.HashStore()
    said = scripts.Generations(notes)
    assert said.look() == []
    notes.set("gen0/members", "[0, 1, 4, 5]")  # generation 1 decided: not formed yet
    assert said.look() == []
    notes.set("gen1/members", "[0, 1]")  # generation 1 failed as it formed (a member died)
    assert said.look() == []
    held = '{"members": [0, 1], "step": 4, "lost": [2, 3, 4, 5], "joined": []}'
    notes.set("gen2/held", held)
    assert said.look() == [
        "ranks [0, 1] went on from step 4 (generation 2): without ranks [2, 3, 4, 5]"
    ]
    notes.set("gen2/grow", "{}")
    notes.set("gen3/held", '{"members": [0, 1, 2, 3], "step": 9, "lost": [], "joined": [2, 3]}')
    assert said.look() == [
        "ranks [0, 1, 2, 3] went on from step 9 (generation 3): with ranks [2, 3] taken back"
    ]
    assert said.look() == []


def test_the_launcher_loads_no_scenario_and_no_scipy():
    """A node started again starts its ranks only once its launcher has imported what it runs:
    the scenario and its delay laws (scipy) are a second of that, and a launcher runs none."""
    code = (
        "import sys, json\n"
        "import tailtrain.cli.launch, tailtrain.runtime.launching.scripts\n"
        "import tailtrain.runtime.launching.failures, tailtrain.runtime.launching.script_rank\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'\n"
        "    or m in ('tailtrain.core.scenario', 'tailtrain.runtime.config'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
