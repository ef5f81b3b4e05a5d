"""``runtime.launching.ranks``: a launch's ranks as their launcher sees them, each part on its
own (``test_scripts`` drives them through the watch): how a job is judged from its ranks'
ends, the restarts' limit, a node leaving whole, a restart said taken in, a bounded stop."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import torch.distributed as dist

from tailtrain.runtime.launching import ranks
from tailtrain.runtime.launching.ranks import Rank, RankState, Restarts


def sleeper(seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", f"import time; time.sleep({seconds})"], start_new_session=True
    )


def ended(rank: int, state: RankState, died: float = float("inf"), why: str = "") -> Rank:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return Rank(rank, done, state=state, died=died, why=why)


def test_a_job_with_a_finished_rank_is_judged_fine_whatever_the_others_did():
    assert (
        ranks.judged([ended(0, RankState.DIED, 1.0, "SIGKILL"), ended(1, RankState.FINISHED)])
        is None
    )


def test_with_none_finished_the_line_names_the_first_to_die_not_the_lowest():
    found = ranks.judged(
        [ended(0, RankState.DIED, 2.0, "exit status 1"), ended(3, RankState.DIED, 1.0, "SIGKILL")]
    )
    assert found == "no rank finished: rank 3 failed first (SIGKILL)"


def test_with_none_finished_ranks_that_left_or_were_stopped_are_named_as_such():
    left = ended(1, RankState.LEFT, why="the run had ended")
    assert ranks.judged([left]) == "no rank finished: ranks [1] left the job (the run had ended)"
    stopped = [ended(0, RankState.STOPPED), ended(1, RankState.STOPPED)]
    assert ranks.judged(stopped) == "no rank finished: rank 0 stopped, rank 1 stopped"


def test_a_rank_is_started_again_at_most_limit_times():
    starts = []

    def start(local: int, k: int) -> subprocess.Popen:
        starts.append((local, k))
        return sleeper(0)

    again = Restarts(2, start)
    r = ended(5, RankState.DIED, 1.0, "SIGKILL")
    r.local = 1
    assert again.restart(r) and r.state is RankState.RUNNING and r.heals
    r.state = RankState.DIED
    assert again.restart(r)
    r.state = RankState.DIED
    assert not again.restart(r) and r.state is RankState.DIED
    assert starts == [(1, 1), (1, 2)]


def test_a_node_is_started_again_whole_only_while_every_rank_has_a_restart_left():
    again = Restarts(1, lambda local, k: sleeper(0))
    node = [ended(2, RankState.DIED, 1.0, "SIGKILL"), ended(3, RankState.DIED)]
    node[1].restarts = 1  # started again once already, on its own
    assert not again.restart_node(node, node[0])
    node[1].restarts = 0
    assert again.restart_node(node, node[0])
    assert [r.restarts for r in node] == [1, 1]
    assert all(r.state is RankState.RUNNING for r in node)


@pytest.mark.timeout(60)
def test_a_node_leaves_whole_its_running_mates_killed_and_every_one_noted_dead():
    notes = dist.HashStore()
    first = ended(4, RankState.DIED, 1.0, "SIGKILL")
    mate = Rank(5, sleeper(30), local=1)
    said = ranks.node_leaves([first, mate], first, notes)
    assert said == "; ranks [5] of its node were stopped"
    assert mate.process.poll() is not None and mate.state is RankState.DIED
    assert mate.why == "its node left with rank 4"
    assert notes.get("dead/4") == b"SIGKILL" and notes.get("dead/5") == mate.why.encode()


def test_a_restart_is_taken_in_only_once_the_live_ranks_wrote_it():
    notes = dist.HashStore()
    back = Rank(1, sleeper(0), restarts=1)
    assert not ranks.taken_in(back, notes)
    notes.set("healed/1", "[2, 12]")
    assert ranks.taken_in(back, notes) and back.healed
    first_start = Rank(0, sleeper(0))  # nothing to heal: never taken in, never said
    assert not ranks.taken_in(first_start, notes)


@pytest.mark.timeout(60)
def test_a_stop_kills_what_ignores_its_signal_after_the_grace(monkeypatch):
    monkeypatch.setattr(ranks, "STOP_GRACE", 0.5)
    deaf = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
         "time.sleep(30)"],
        stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert deaf.stdout.readline() == b"ready\n"
    r = Rank(0, deaf)
    ranks.stop([r], signal.SIGTERM)
    # it ignores SIGTERM: only the kill after the grace ends it
    assert deaf.returncode == -signal.SIGKILL and r.state is RankState.STOPPED
