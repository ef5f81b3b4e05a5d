"""examples/shrink_loop.py with the drills of a job across nodes that a rank's own SIGKILL
cannot stage (test_nodes.py runs it under ``tailtrain launch``):

    node_drill.py [--stop-node STEP:RANK] [--die-in census:RANK | grow:RANK] EXAMPLE ARGS...

* ``--stop-node STEP:RANK``: when rank RANK calls step STEP, its whole node stops: a helper
  process of its own session SIGSTOPs the node's launcher and every rank of it (as a machine
  that freezes), waits until the other ranks' census went on without them (its
  ``gen{g}/members`` written: they waited past the learned deadline), then SIGCONTs them all.
  The helper starts with the rank, so it is ready (torch imported) before the step.
* ``--die-in census:RANK``: rank RANK checks in to the first census it takes part in, then
  SIGKILLs itself before the census closes (a death during the census: a rank counted alive
  that is not).
* ``--die-in grow:RANK``: rank RANK SIGKILLs itself as it enters the first grow (a death
  during a heal: the live ranks are taking a node back in).

Everything else is the example's own (its arguments, records and ``--out`` files), so the
reference rebuilt from the records (test_shrink_step.rebuilt) holds as it does for it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "shrink_loop.py"
#: the bound on every wait of a drill (seconds)
BOUND = 120.0


def node_of(launcher: int) -> list[int]:
    """The launcher and its children (the node's ranks)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == launcher:
            children.append(int(entry.name))
    return [launcher, *children]


def stopper(launcher: int, folder: Path) -> None:
    """The helper of ``--stop-node`` (module docstring): ready once torch is imported; on
    ``go`` (which holds the generation to wait for) stops the node, waits for that
    generation's census, continues the node and says so (``continued``)."""
    from tailtrain.runtime.elastic.store import open_store

    store = open_store(datetime.timedelta(seconds=BOUND))
    (folder / "ready").touch()
    go, end = folder / "go", time.monotonic() + 3 * BOUND
    while not go.exists():
        if time.monotonic() > end:
            return
        time.sleep(0.005)
    pids = node_of(launcher)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    generation = int(go.read_text())
    try:
        store.wait([f"gen{generation}/members"], datetime.timedelta(seconds=BOUND))
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        (folder / "continued").touch()


def wait_for(path: Path) -> None:
    end = time.monotonic() + BOUND
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.005)


def arm(rank: int, stop_node: str | None, die_in: str | None) -> None:
    """Install the drills this rank takes part in."""
    from tailtrain.integrate.step import StragglerStep
    from tailtrain.runtime.elastic.shrink import Shrinker

    if stop_node is not None and int(stop_node.split(":")[1]) == rank:
        at = int(stop_node.split(":")[0])
        folder = Path(os.environ["TAILTRAIN_LAUNCH_NOTES"]) / f"stop-node-{rank}"
        folder.mkdir()
        command = [sys.executable, __file__, "--stopper", str(os.getppid()), str(folder)]
        subprocess.Popen(command, start_new_session=True)  # not stopped with the node
        call = StragglerStep.__call__

        def stopped(self, micro_batches, loss_fn):
            if self.next_step == at and not (folder / "go").exists():
                wait_for(folder / "ready")
                (folder / "go").write_text(str(self.shrinker.generation))
                wait_for(folder / "continued")  # stopped meanwhile, inside the step
            return call(self, micro_batches, loss_fn)

        StragglerStep.__call__ = stopped
    if die_in is not None and int(die_in.split(":")[1]) == rank:
        where = die_in.split(":")[0]
        original = getattr(Shrinker, where)

        def dies(self, step, rows):
            if where == "census":  # counted alive by the others: it checked in
                self.store.set(f"gen{self.generation}/in/{self.rank}", json.dumps([step, rows]))
            os.kill(os.getpid(), signal.SIGKILL)
            return original(self, step, rows)

        setattr(Shrinker, where, dies)


def main() -> None:
    if sys.argv[1:2] == ["--stopper"]:
        stopper(int(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-node", default=None)
    parser.add_argument("--die-in", default=None)
    ours, rest = parser.parse_known_args()
    if "TAILTRAIN_RESTART" not in os.environ:  # a rank started again undergoes none
        arm(int(os.environ["RANK"]), ours.stop_node, ours.die_in)
    spec = importlib.util.spec_from_file_location("shrink_loop", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    sys.argv = [str(EXAMPLE), *rest]
    example.main()


if __name__ == "__main__":
    main()
