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


def test_direct_activation_keys_parse_and_round_trip() -> None:
    model = parse_network("hop=2e-3,overhead=2e-5,allreduce=1e-2,direct=8,send=1e-4")
    assert (model.direct, model.send) == (8, 1e-4)
    assert parse_network(model.spec()) == model
    assert (parse_network("hop=1").direct, parse_network("hop=1").send) == (0, 0.0)
    assert "direct" not in parse_network("hop=1").spec()  # the default spec is unchanged


@pytest.mark.parametrize("text", ["direct=-1", "direct=2.5", "direct=x", "send=-1", "send=inf"])
def test_bad_direct_activation_keys_are_one_line_usage_errors(text: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_network(text)
    assert "\n" not in str(err.value)
    assert text.split("=")[0] in str(err.value)
