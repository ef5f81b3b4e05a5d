"""The hang drill (``runtime.drills.hang``, issue 14; ``tailtrain bench hang``): how long a
partial collective's rounds wait for a hung process, on real gloo processes."""

from __future__ import annotations

import pytest

from tailtrain.runtime.drills.hang import HangDrill, run_hang_drill
from tailtrain.runtime.launching.failures import JobFailed
from tailtrain.strategies.eager import Collective

pytestmark = pytest.mark.timeout(90)


def test_a_hung_main_thread_stalls_no_solo_round_but_the_synchronous_one():
    """Solo: the hung rank's progress threads contribute its buffer, so the others' rounds go
    on while it hangs and it comes back late; a synchronous round waits for its call."""
    solo = run_hang_drill(HangDrill(procs=4, collective=Collective.SOLO, seconds=2.0, rounds=60))
    assert solo["rounds_while_hung"] >= 5
    assert solo["returned"]["kind"] == "late" and solo["returned"]["adopted"] > 5
    sync = run_hang_drill(HangDrill(procs=3, collective=Collective.ALLREDUCE, seconds=1.0))
    assert sync["rounds_while_hung"] == 0
    assert sync["returned"] == {"kind": "active", "called": 5, "adopted": 5}


def test_a_wait_past_the_timeout_fails_in_one_line_naming_the_rank():
    drill = HangDrill(procs=3, collective=Collective.ALLREDUCE, seconds=3.0, timeout=1.0)
    with pytest.raises(JobFailed, match=r"rank \d failed: CollectiveTimeout: rank \d: waited 1s"):
        run_hang_drill(drill)


@pytest.mark.parametrize(
    "flag, value",
    [("--seconds", "-1"), ("--compute", "-0.5"), ("--compute", "nan"), ("--timeout", "0")],
)
def test_bench_hang_refuses_a_negative_or_endless_duration_before_any_rank_starts(
    flag, value, capsys
):
    from tailtrain.cli import main

    assert main(["bench", "hang", flag, value]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
