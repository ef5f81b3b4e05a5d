"""Every strategy's name and the topology it runs on, without importing a rule.

The CLI's parser imports nothing heavy (``tests/cli/test_cli_imports.py``), and the registry
(``strategies.registry.BUILDERS``) imports every rule and numpy; so this table says the same
names light, and a test holds it to the registry: each name is there, in the same order, on
the topology its strategy declares (``Strategy.topology``). ``train --strategy``'s help and a
user loop's refusal (``strategies.entries``) list the strategies from it.
"""

from __future__ import annotations

#: strategy name -> the topology (``strategies.base.Topology``'s value) its spec runs on
#: without options (``sync:mode=M`` is a parameter-server rule: ``kfamily``), in
#: ``BUILDERS``' order
TOPOLOGY_OF: dict[str, str] = {
    "sync": "allreduce",
    "dropcompute": "allreduce",
    "local-sgd": "allreduce",
    "k-sync": "parameter-server",
    "k-batch-sync": "parameter-server",
    "k-async": "parameter-server",
    "k-batch-async": "parameter-server",
    "async": "parameter-server",
    "dbw": "parameter-server",
    "b-dbw": "parameter-server",
    "adasync": "parameter-server",
    "lgc": "parameter-server",
    "eager": "partial-collective",
    "dbw-quorum": "partial-collective",
    "rebalance": "allreduce",
}


def on(topology: str) -> list[str]:
    """The strategies that run on ``topology`` (its value), in the table's order."""
    return [name for name, runs_on in TOPOLOGY_OF.items() if runs_on == topology]


def strategy_help() -> str:
    """``train --strategy``'s help: the strategies by topology, as the registry has them."""
    return (
        f"an allreduce strategy ({', '.join(on('allreduce'))}), a partial collective "
        f"({', '.join(on('partial-collective'))}) or a parameter-server strategy "
        f"({', '.join(on('parameter-server'))}; one extra rank serves); options follow a "
        "colon, e.g. dropcompute:threshold=auto, k-sync:k=8 (default: %(default)s)"
    )
