"""What the CLI tests share: running ``tailtrain`` as a user does."""

from __future__ import annotations

from tailtrain.cli import main


def run(argv: list[str], capture) -> tuple[int, str, str]:
    """``tailtrain ARGV`` in this process: (exit status, stdout, stderr), a ``SystemExit``
    (argparse's exit 2) included; ``capture`` is pytest's ``capsys`` or ``capfd`` (the latter
    when launched ranks write to the same terminal)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capture.readouterr()
    return code, out, err
