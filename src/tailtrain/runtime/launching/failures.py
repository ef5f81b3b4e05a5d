"""A local job's failure in one line: which rank failed first, and why.

Torch elastic's error file names the first rank that failed; the survivors' note
(``runtime.keep``) adds the step, a rank that hung and the checkpoint to resume from. The
launchers (``launching.launch``, ``launching.scripts``, ``launching.local``) raise
:class:`JobFailed` with that line.
"""

from __future__ import annotations

from tailtrain.errors import TailtrainError
from tailtrain.runtime.keep import describe


class JobFailed(TailtrainError):
    """A rank failed; the message names it in one line."""


def describe_failure(exc: Exception, note: dict | None = None) -> str:
    """One line naming the first rank that failed and why (from torch elastic's error file);
    with the survivors' ``note`` (``runtime.keep``), also the step, a rank that hung, and the
    checkpoint to resume from."""
    rank, failure = exc.get_first_failure()  # type: ignore[attr-defined]
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = one_line(str(message)) if message else f"exit code {failure.exitcode}"
    signal_name = failure.signal_name() if failure.exitcode < 0 else None
    return describe(rank, text, signal_name, note)


def one_line(exc: BaseException | str) -> str:
    text = str(exc).strip()
    if isinstance(exc, BaseException):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text.splitlines()[0] if text else "no message"
