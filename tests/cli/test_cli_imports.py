"""The parser loads nothing heavy (issue 34 item 5): `tailtrain --help`, any command's
`--help` and a bad flag answer at once because building the parser imports the standard
library and the light part of tailtrain only; torch, scipy, numpy, matplotlib and rich load
when a command runs. The help's figures the parser writes out are pinned to their sources."""

from __future__ import annotations

import json
import subprocess
import sys

from tailtrain.cli import advise as advise_cli
from tailtrain.cli import bench, launch, predict

#: what one fresh interpreter runs: every argv through ``main`` (each ends in SystemExit
#: before any command's ``run``), then the third-party top-level modules that loaded
PROBE = """
import json, sys
before = set(sys.modules)  # the interpreter's own (site's .pth hooks among them)
from tailtrain.cli import main
for argv in json.loads(sys.argv[1]):
    try:
        main(argv)
    except SystemExit:
        pass
    else:
        raise AssertionError(f"{argv} reached a command's run")
loaded = {name.partition(".")[0] for name in set(sys.modules) - before}
print(json.dumps(sorted(loaded - set(sys.stdlib_module_names) - {"tailtrain"})))
"""

#: --help of tailtrain and of every command, bad flags and values the parser itself refuses
ARGVS = [
    ["--help"],
    ["--version"],
    *(
        [*command, "--help"]
        for command in (
            ["predict"],
            ["advise"],
            ["simulate"],
            ["simulate", "collectives"],
            ["compare"],
            ["reproduce"],
            ["train"],
            ["bench"],
            ["bench", "collectives"],
            ["bench", "hang"],
            ["launch"],
            ["store"],
        )
    ),
    ["--bogus"],
    ["train", "--bogus"],
    ["--strategy", "sync", "train"],  # a command's option before the command
    ["predict", "--workers", "x", "--delay", "exp:rate=1"],
    ["simulate", "--seed", "-1"],
    ["bench", "hang", "--collective", "x"],
    ["advise", "--for", "x", "trace.csv"],
    ["nope"],
]


def test_building_the_parser_loads_no_third_party_module():
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(ARGVS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.splitlines()[-1]) == [], (
        "the parser imports a heavy module: move the import into the command's run"
    )


def test_the_probe_sees_a_heavy_import():
    """The check above can fail: a parser that imports numpy is caught."""
    code = PROBE.replace(
        "from tailtrain.cli import main", "from tailtrain.cli import main\nimport numpy"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps([["--help"]])],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "numpy" in json.loads(out.stdout.splitlines()[-1])


def test_the_parsers_written_out_figures_are_their_sources():
    from tailtrain.advice.adopt import SETUPS
    from tailtrain.delays.trace import TRACE_FORMAT
    from tailtrain.prediction.families import SIM_MAX_WORKERS
    from tailtrain.prediction.scenario import ALL_K_UP_TO
    from tailtrain.runtime.elastic.shrink import OnRankLoss
    from tailtrain.strategies.eager import Collective

    assert advise_cli._TRACE_FORMAT == TRACE_FORMAT
    assert tuple(SETUPS) == advise_cli._SETUPS
    assert (predict._ALL_K_UP_TO, predict._SIM_MAX_WORKERS) == (ALL_K_UP_TO, SIM_MAX_WORKERS)
    assert tuple(c.value for c in Collective) == bench.COLLECTIVES
    assert OnRankLoss.STOP.value == launch.DEFAULT_ON_RANK_LOSS
