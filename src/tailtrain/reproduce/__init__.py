"""Reproductions of the five papers' figures and tables at laptop scale.

``tailtrain reproduce --list`` names them; ``tailtrain reproduce NAME --out DIR [--quick]``
writes PNG plots and a ``report.md`` with the paper's numbers beside ours. The experiments
live in one module per paper (``dropcompute``, ``dbw``, ``eager``, ``stale``, ``lgc``) and
are listed in ``registry``.
"""
