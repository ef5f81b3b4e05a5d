"""The ``--network`` spec: interconnect latencies that live in the scenario, not in rules."""

from __future__ import annotations

import pytest

from tailtrain.errors import UsageError
from tailtrain.network import DEFAULT_HOP, NetworkModel, parse_network


def test_defaults_and_round_trip() -> None:
    assert parse_network(None) == NetworkModel(DEFAULT_HOP, 0.0, None)
    model = parse_network("hop=2e-6,overhead=1e-4,allreduce=3e-5")
    assert model == NetworkModel(2e-6, 1e-4, 3e-5)
    assert parse_network(model.spec()) == model


@pytest.mark.parametrize("text", ["hop=-1", "hop=inf", "latency=1", "hop", "overhead=x"])
def test_bad_network_specs_are_one_line_usage_errors(text: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_network(text)
    assert "\n" not in str(err.value)
