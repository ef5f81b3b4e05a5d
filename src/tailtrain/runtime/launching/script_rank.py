"""One rank of ``tailtrain launch``: your script, run as ``python script.py args...`` runs it,
whose bad input and crash the launcher reports in one line (``runtime.launching.scripts``).

``tailtrain launch`` starts each rank as
``python -m tailtrain.runtime.launching.script_rank script.py args...``: the script runs as
``__main__`` (``runpy``), with ``sys.argv`` and ``sys.path[0]`` as ``python script.py`` sets
them. What differs is how it ends:

* **Bad input** (``argparse`` refusing the arguments, or a :class:`~tailtrain.UsageError`
  out of the script): every rank finds it, and N copies of a usage block and a traceback
  would bury it. The rank prints nothing, writes the one line (argparse's own
  ``prog: error: message``, or ``script.py: error: message``) where the launcher reads it
  (:data:`NOTES`) and exits 2; the launcher prints it once and exits 2. A script's parser
  keeps its own ``error`` where it overrides it: this replaces only
  ``argparse.ArgumentParser.error``'s printing, and still ends in ``SystemExit(2)`` (a script
  that catches it keeps working).
* **Ctrl-C** (the SIGINT the launcher forwards): ``KeyboardInterrupt`` out of the script is
  no failure; the rank exits 130 without a traceback (what the script wrote before is its
  own to keep), and the launcher says the one line.
* **A crash**: the rank waits :data:`CRASH_GRACE` seconds first. A rank whose collective
  failed because a peer left (gloo's "Connection closed by peer") is a consequence, not the
  cause: by then the launcher, which saw the peer end, stops it (SIGTERM) and it says
  nothing; after a Ctrl-C (the launcher's :data:`INTERRUPTED_MARK`) it exits 130, silent.
  A rank still there after the wait prints its traceback as Python prints it (from the
  script's frames on), leaves the exception's last line for the launcher's line naming the
  rank, and exits 1.

This module imports only the standard library and ``tailtrain.errors``: the rank pays nothing
before its script, and the script's ``sys.modules`` is what it imports.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

from tailtrain.errors import UsageError

#: where a rank writes its one line for the launcher (a folder the launcher made)
NOTES = "TAILTRAIN_LAUNCH_NOTES"
#: exit status of bad input, and of a rank stopped by Ctrl-C (128 + SIGINT)
BAD_INPUT, INTERRUPTED = 2, 130
#: what a note says happened
USAGE_NOTE, CRASH_NOTE = "usage", "crash"
#: seconds a crashed rank waits before it speaks: the launcher looks every 0.05 s
#: (``runtime.launching.scripts.WATCH_POLL``), so a rank that failed only because a peer ended
#: first is stopped in that time, silent, on however loaded a machine
CRASH_GRACE = 2.0
#: the file in :data:`NOTES` the launcher writes before it forwards a Ctrl-C to the ranks
INTERRUPTED_MARK = "interrupted"


class BadArguments(SystemExit):
    """``argparse``'s refusal, not printed: ``SystemExit(2)`` with its one line."""

    def __init__(self, line: str) -> None:
        super().__init__(BAD_INPUT)
        self.line = line


def _refuse(parser: argparse.ArgumentParser, message: str) -> None:
    """``ArgumentParser.error`` in a launched rank: the line, no usage block, not printed."""
    raise BadArguments(f"{parser.prog}: error: {message}")


def note_path(folder: str | os.PathLike, rank: int | str) -> Path:
    """The file rank ``rank`` writes its note in."""
    return Path(folder) / f"rank-{rank}.json"


def take_note(folder: str | os.PathLike, rank: int | str) -> dict | None:
    """Rank ``rank``'s note, ``{"kind": USAGE_NOTE|CRASH_NOTE, "line": ...}``, or None; removed, so
    that a rank started again (``--restart-lost``) leaves its own."""
    path = note_path(folder, rank)
    try:
        note = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    path.unlink(missing_ok=True)
    return note


def _note(kind: str, line: str) -> None:
    folder = os.environ.get(NOTES)
    if folder is None:  # run by hand, not by the launcher: say it here
        if kind == USAGE_NOTE:
            print(line, file=sys.stderr)
        return
    path = note_path(folder, os.environ.get("RANK", "0"))
    path.with_suffix(".tmp").write_text(json.dumps({"kind": kind, "line": line}))
    path.with_suffix(".tmp").replace(path)  # the launcher never reads half a note


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    text = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
    return text


def run_script(argv: list[str]) -> int:
    """Run ``argv[0]`` with arguments ``argv[1:]`` as ``__main__``; the rank's exit status."""
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(script))  # as `python script.py` sets it
    argparse.ArgumentParser.error = _refuse  # type: ignore[method-assign]
    try:
        runpy.run_path(script, run_name="__main__")
    except BadArguments as exc:
        _note(USAGE_NOTE, exc.line)
        return BAD_INPUT
    except UsageError as exc:
        _note(USAGE_NOTE, f"{Path(script).name}: error: {exc}")
        return BAD_INPUT
    except KeyboardInterrupt:
        return INTERRUPTED
    except SystemExit:
        raise
    except BaseException as exc:
        return crashed(exc)
    return 0


def crashed(exc: BaseException) -> int:
    """The end of a rank whose script raised ``exc`` (module docstring); its exit status."""
    folder = os.environ.get(NOTES)
    if folder is not None:  # launched: a consequence of a peer's end is stopped meanwhile
        try:
            time.sleep(CRASH_GRACE)
        except KeyboardInterrupt:  # the Ctrl-C that made the peer leave arrived late
            return INTERRUPTED
        if (Path(folder) / INTERRUPTED_MARK).exists():
            return INTERRUPTED
    try:
        tb = exc.__traceback__  # from the script's frames on: runpy's and ours say nothing
        while tb is not None and (
            tb.tb_frame.f_globals is globals() or tb.tb_frame.f_globals.get("__name__") == "runpy"
        ):
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        _note(CRASH_NOTE, _last_line(exc))
    except KeyboardInterrupt:
        return INTERRUPTED
    return 1


if __name__ == "__main__":
    sys.exit(run_script(sys.argv[1:]))
