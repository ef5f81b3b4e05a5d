"""Closed-form families and the exact law of a sum of M i.i.d. micro-batch times."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tailtrain.delays import parse_delay
from tailtrain.theory.families import (
    NonNegative,
    ScaledScipyDelay,
    closed_form,
    exponential_params,
    nonnegative,
)


@pytest.mark.parametrize(
    ("spec", "kind", "shift"),
    [
        ("exp:rate=2", "gamma", 0.0),
        ("shifted-exp:shift=1,scale=0.5", "gamma", 1.0),
        ("const:value=0.3+exp:rate=1", "gamma", 0.3),
        ("exp:rate=2+exp:rate=2", "gamma", 0.0),
        ("gamma:shape=2,rate=3", "gamma", 0.0),
        ("normal:mean=1,std=0.2+normal:mean=0.5,std=0.1", "normal", 0.0),
        ("const:value=0.5", "const", 0.5),
        ("bernoulli:p=0.3,value=2", "bernoulli", 0.0),
    ],
)
def test_recognised_families(spec, kind, shift):
    form = closed_form(parse_delay(spec))
    assert form is not None and form.kind == kind and form.shift == pytest.approx(shift)


@pytest.mark.parametrize(
    "spec",
    [
        "lognormal:mu=0,sigma=1",
        "exp:rate=1+exp:rate=2",
        "const:value=0.5+dropcompute-noise:scale=0.5",
    ],
)
def test_no_closed_form(spec):
    assert closed_form(parse_delay(spec)) is None


def test_a_name_alone_is_not_trusted():
    # a model whose spec says exp but whose law is not: verification against its cdf rejects it
    impostor = ScaledScipyDelay(stats.expon(scale=2.0), spec="exp:rate=1")
    assert closed_form(impostor) is None
    assert exponential_params(parse_delay("shifted-exp:shift=2,rate=4")) == (2.0, 4.0)


@pytest.mark.parametrize(
    "spec",
    [
        "exp:rate=2",
        "shifted-exp:shift=0.2,rate=3",
        "gamma:shape=0.5,rate=2",
        "normal:mean=1,std=0.3",
        "bernoulli:p=0.3,value=2",
        "const:value=0.4",
    ],
)
def test_sum_of_m_matches_simulated_sums(spec, rng, mc):
    model, m = parse_delay(spec), 5
    draws = model.sample(rng, (40_000, m)).sum(axis=1)
    law = closed_form(model).sum_of(m)
    assert law.mean == pytest.approx(m * model.mean, rel=1e-12)
    assert law.var == pytest.approx(m * model.var, rel=1e-12, abs=1e-15)
    # P(S <= x) at interior points: a proportion with binomial standard error
    x = np.unique(law.quantile([0.1, 0.3, 0.5, 0.7, 0.9])) + 1e-9
    hits = (draws[:, None] <= x).astype(float)
    mean, stderr = mc.mean(hits)
    mc.within(law.cdf(x), mean, np.maximum(stderr, 1 / draws.size))


def test_nonnegative_clips_only_when_it_matters(rng, mc):
    narrow, wide = parse_delay("normal:mean=1,std=0.2"), parse_delay("normal:mean=0.2,std=1")
    assert nonnegative(narrow) is narrow
    clipped = nonnegative(wide)
    assert isinstance(clipped, NonNegative) and clipped.cdf(-0.1) == 0.0
    mean, stderr = mc.mean(np.maximum(wide.sample(rng, 200_000), 0.0))
    mc.within(clipped.mean, mean, stderr)
