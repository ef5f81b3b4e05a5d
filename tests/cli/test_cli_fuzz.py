"""Hypothesis fuzzes the command line: random argv lists from the real flags and edge values
end in exit status 0, 2 (bad input: one line on stderr) or 3, never in a traceback."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailtrain.cli import main

# values stay small where they are valid, so that a run that starts ends within a second
VALUES = {
    "--workers": ["0", "-1", "1", "3", "x", "99999999999", "2.5"],
    "--procs": ["0", "1", "3", "x", "99999999999"],
    "--delay": ["exp:rate=1", "const:value=0", "bogus", "exp:rate=-1", "uniform:low=2,high=1"],
    "--skew": ["linear:step=0.001", "zigzag", "iid"],
    "--pattern": ["iid", "persistent:h=0", "subset:s=9,delay=1", "heterogeneous:low=1,high=2"],
    "--task": ["none", "logreg", "nope", "hyperplane:dim=0", "mnist"],
    "--strategy": ["sync", "k-sync:k=2", "k-sync:k=99", "dbw", "eager:mode=solo", "x:y"],
    "--strategies": ["sync", "sync,sync", ",", "k-sync:k=2,dbw"],
    "--iterations": ["0", "1", "2", "-3", "abc"],
    "--time-budget": ["0", "-1", "nan", "inf", "2", "abc"],
    "--eval-every": ["0", "1", "x"],
    "--eval-interval": ["0", "1e-12", "0.5", "nan"],
    "--micro-batches": ["0", "1", "2", "x", "99999999"],
    "--comm-time": ["0", "-1", "exp:rate=10", "x"],
    "--network": ["hop=1e-6", "hop=-1", "x=1"],
    "--partition": ["iid", "shared", "noniid:classes=99", "x"],
    "--lr": ["0", "-1", "0.1", "nan", "1e300"],
    "--target-loss": ["-1", "0.5", "nan", "inf"],
    "--seed": ["0", "-1", "x", "99999999999999999999"],
    "--seeds": ["0", "0,0", "0,x", ""],
    "--k": ["all", "0", "1,2", "x"],
    "--samples": ["0", "100", "x"],
    "--quorum": ["0", "1", "99"],
    "--checkpoint-every": ["0", "1", "x"],
    "--inject-fault": [
        "nan:worker=0,step=0",
        "nan:worker=99,step=0",
        "boom",
        "inf:worker=1,step=1",
    ],
    "--on-nonfinite": ["skip", "raise", "x"],
    "--threads": ["0", "1", "x"],
    "--data": ["/nonexistent"],
}
SWITCHES = ["--json", "--no-progress", "--overwrite", "--verbose", "--help-me"]
COMMANDS = [["predict"], ["simulate"], ["compare"], ["simulate", "collectives"]]


@st.composite
def argvs(draw, out):
    before = draw(st.lists(st.sampled_from(["--threads", "--workers", "-v"]), max_size=1))
    argv = []
    for flag in before:
        argv += [flag, *([draw(st.sampled_from(VALUES[flag]))] if flag in VALUES else [])]
    command = draw(st.sampled_from(COMMANDS))
    argv += command
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 4)) == 0:
            argv.append(draw(st.sampled_from(SWITCHES)))
        else:
            flag = draw(st.sampled_from(sorted(VALUES)))
            argv += [flag, draw(st.sampled_from(VALUES[flag]))]
    if command in (["simulate"], ["compare"]):  # keep a run that starts short
        argv += draw(st.sampled_from([["--iterations", "2"], ["--time-budget", "2"]]))
        argv += [] if "--task" in argv else ["--task", "none"]
        argv += [] if command != ["compare"] else ["--seeds", "0"] * ("--seeds" not in argv)
        argv += ["--out", str(out / str(draw(st.integers(0, 3))))]
    return argv


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_command_lines_end_cleanly(data, tmp_path_factory, capsys):
    out = tmp_path_factory.mktemp("fuzz")
    argv = data.draw(argvs(out))
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: usage errors and --help
        code = exc.code
    _, err = capsys.readouterr()
    assert code in (0, 2, 3), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1, (argv, err)
