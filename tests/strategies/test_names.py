"""The light table of strategy names (``strategies.names``) says what the registry says: the
same names in the same order, each on the topology its strategy declares, so the CLI's help
and a loop's refusal list the strategies a new one adds without importing a rule."""

from __future__ import annotations

import re

from tailtrain.errors import UsageError
from tailtrain.strategies.names import TOPOLOGY_OF, on, strategy_help
from tailtrain.strategies.registry import BUILDERS, parse_strategy

#: a builder's message for a parameter it needs (``spec.Spec``): filled in with a small value
MISSING = re.compile(r"missing parameter '([\w-]+)'")


def built(name: str):
    """The strategy ``name`` builds with the fewest options: each required one set to 2."""
    spec = name
    for _ in range(5):
        try:
            return parse_strategy(spec)
        except UsageError as exc:
            found = MISSING.search(str(exc))
            assert found is not None, str(exc)
            spec += f"{':' if spec == name else ','}{found.group(1)}=2"
    raise AssertionError(f"{name}: too many required options")


def test_the_table_names_the_registry_in_order():
    assert list(TOPOLOGY_OF) == list(BUILDERS)


def test_each_name_runs_on_the_topology_its_strategy_declares():
    declared = {name: built(name).topology.value for name in BUILDERS}
    assert declared == TOPOLOGY_OF


def test_the_help_lists_every_strategy_by_topology():
    text = strategy_help()
    assert all(name in text for name in TOPOLOGY_OF)
    assert f"an allreduce strategy ({', '.join(on('allreduce'))})" in text
    assert on("allreduce") == ["sync", "dropcompute", "local-sgd", "rebalance"]
