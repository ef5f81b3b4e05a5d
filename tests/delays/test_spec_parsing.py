"""``parse_delay``: every distribution name, sums, and every kind of bad input."""

from __future__ import annotations

import pytest

from tailtrain.delays import DISTRIBUTIONS, SumDelay, parse_delay
from tailtrain.errors import UsageError

VALID = {
    "const": "const:value=0.5",
    "uniform": "uniform:low=0,high=1",
    "normal": "normal:mean=1,std=0.1",
    "exp": "exp:rate=2",
    "shifted-exp": "shifted-exp:shift=0.3,scale=0.7",
    "pareto": "pareto:shape=2,scale=1",
    "lognormal": "lognormal:mu=-1.84,sigma=0.83",
    "gamma": "gamma:shape=1,rate=4.5",
    "bernoulli": "bernoulli:p=0.5,value=0.45",
    "dropcompute-noise": "dropcompute-noise:scale=0.5",
}


def test_every_registered_distribution_except_trace_has_a_valid_example() -> None:
    assert set(VALID) | {"trace"} == set(DISTRIBUTIONS)


@pytest.mark.parametrize("spec", VALID.values())
def test_single_term_parses_to_that_model(spec: str) -> None:
    model = parse_delay(spec)
    assert model.spec == spec and not isinstance(model, SumDelay)


def test_sum_keeps_terms_in_order_and_tolerates_spaces() -> None:
    model = parse_delay(" const:value=0.45 + lognormal:mu=-1.84,sigma=0.83 ")
    assert isinstance(model, SumDelay)
    assert [t.spec for t in model.terms] == ["const:value=0.45", "lognormal:mu=-1.84,sigma=0.83"]
    assert model.spec == "const:value=0.45+lognormal:mu=-1.84,sigma=0.83"


def test_plus_inside_a_number_does_not_split_terms() -> None:
    model = parse_delay("const:value=1e+1+exp:rate=+2")
    assert model.mean == pytest.approx(10.5)


def test_zero_is_a_valid_time_and_probability() -> None:
    assert parse_delay("const:value=0").mean == 0
    assert parse_delay("bernoulli:p=0,value=1").mean == 0
    assert parse_delay("bernoulli:p=1,value=2").var == 0


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("weibull:shape=1", "unknown delay distribution 'weibull'"),
        ("exp", "missing parameter 'rate'"),
        ("exp:", "malformed"),
        ("", "empty delay"),
        ("   ", "empty delay"),
        ("exp:rate", "should be key=value"),
        ("exp:rate=1,rate=2", "given twice"),
        ("exp:rate=fast", "not a number"),
        ("exp:rate=0", "must be > 0"),
        ("exp:rate=-1", "must be > 0"),
        ("exp:rate=inf", "finite"),
        ("exp:rate=nan", "NaN"),
        ("exp:mean=1", "does not take parameter 'mean'"),
        ("const:value=-0.1", "must be >= 0"),
        ("uniform:low=2,high=1", "high > low"),
        ("uniform:low=-1,high=1", "must be >= 0"),
        ("normal:mean=1,std=0", "must be > 0"),
        ("normal:mean=1", "missing parameter 'std'"),
        ("shifted-exp:shift=1", "exactly one of rate= or scale="),
        ("shifted-exp:shift=1,rate=1,scale=1", "exactly one of rate= or scale="),
        ("shifted-exp:shift=-1,rate=1", "must be >= 0"),
        ("shifted-exp:rate=1", "missing parameter 'shift'"),
        ("pareto:shape=2", "missing parameter 'scale'"),
        ("pareto:shape=-2,scale=1", "must be > 0"),
        ("lognormal:mu=0,sigma=-1", "must be > 0"),
        ("gamma:shape=1,scale=2", "does not take parameter 'scale'"),
        ("bernoulli:p=1.5,value=1", "must be <= 1"),
        ("bernoulli:p=-0.5,value=1", "must be >= 0"),
        ("bernoulli:p=0.5,value=-1", "must be >= 0"),
        ("dropcompute-noise:scale=0", "must be > 0"),
        ("dropcompute-noise", "missing parameter 'scale'"),
        ("exp:rate=1+", "malformed delay"),
        ("+exp:rate=1", "malformed delay"),
        ("exp:rate=1++const:value=1", "malformed delay"),
        ("exp:rate=1+foo:x=1", "unknown delay distribution 'foo'"),
        ("trace", "missing parameter 'path'"),
    ],
)
def test_bad_spec_is_a_one_line_usage_error_naming_the_problem(spec: str, needle: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_delay(spec)
    message = str(caught.value)
    assert needle in message and "\n" not in message


def test_unknown_distribution_lists_the_known_ones() -> None:
    with pytest.raises(UsageError, match="known: const, uniform, normal, exp, shifted-exp"):
        parse_delay("expo:rate=1")
