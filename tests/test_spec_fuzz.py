"""Hypothesis fuzzes the spec parsers: any text gives a value or a UsageError, nothing else."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailtrain.delays import parse_delay, parse_pattern
from tailtrain.delays.comm import parse_comm_time
from tailtrain.errors import UsageError
from tailtrain.faults import parse_fault
from tailtrain.network import parse_network
from tailtrain.strategies.registry import parse_strategy
from tailtrain.tasks import parse_partition, parse_task

NAMES = [
    "exp", "const", "uniform", "normal", "shifted-exp", "pareto", "lognormal", "gamma",
    "bernoulli", "dropcompute-noise", "trace", "iid", "heterogeneous", "persistent", "subset",
    "linear", "rotating", "slowdown", "sync", "k-sync", "k-async", "dbw", "b-dbw", "lgc",
    "dropcompute", "local-sgd", "eager", "dbw-quorum", "adasync", "logreg", "none",
    "hyperplane", "noniid", "shared", "nan", "inf", "",
]  # fmt: skip
KEYS = [
    "rate", "value", "low", "high", "mean", "std", "shift", "scale", "shape", "mu", "sigma",
    "p", "h", "s", "delay", "step", "at", "fraction", "factor", "k", "mode", "window", "beta",
    "blocks", "threshold", "period", "classes", "dim", "hop", "overhead", "worker", "path", "x",
]  # fmt: skip
VALUES = ["0", "1", "-1", "0.5", "1e308", "1e-300", "nan", "inf", "-inf", "x", "", "3", "auto"]


@st.composite
def specs(draw):
    """``name[:key=value,...]`` built from real names, keys and edge values, plus noise."""
    if draw(st.booleans()):
        return draw(st.text(alphabet=":=,+.-e0123456789abxyz ", max_size=30))
    terms = []
    for _ in range(draw(st.integers(1, 2))):
        name = draw(st.sampled_from(NAMES))
        pairs = draw(
            st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)), max_size=3)
        )
        body = ",".join(f"{k}={v}" for k, v in pairs)
        terms.append(f"{name}:{body}" if pairs or draw(st.booleans()) else name)
    return "+".join(terms)


PARSERS = [
    parse_delay,
    parse_pattern,
    parse_strategy,
    parse_partition,
    parse_network,
    parse_comm_time,
    parse_fault,
    lambda text: parse_task(text, data="/nonexistent", seed=0),
]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=specs(), which=st.integers(0, len(PARSERS) - 1))
def test_spec_parsers_accept_or_refuse_in_one_line(text, which):
    try:
        PARSERS[which](text)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc)
