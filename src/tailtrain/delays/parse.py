"""``parse_delay``: from spec text such as ``const:value=0.45+lognormal:mu=-1.84,sigma=0.83``
to a :class:`~tailtrain.delays.base.DelayModel`.

Terms joined by ``+`` are independent and add up. A ``+`` followed by a digit or sign stays
inside a number (``1e+3``), so only a ``+`` that starts a new name splits terms.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tailtrain.delays import atomic, parametric
from tailtrain.delays.base import DelayModel
from tailtrain.delays.dropcompute_noise import dropcompute_noise
from tailtrain.delays.sum import SumDelay
from tailtrain.delays.trace import trace
from tailtrain.errors import UsageError
from tailtrain.spec import Spec, parse_spec

DISTRIBUTIONS: dict[str, Callable[[Spec], DelayModel]] = {
    "const": atomic.constant,
    "uniform": parametric.uniform,
    "normal": parametric.normal,
    "exp": parametric.exponential,
    "shifted-exp": parametric.shifted_exponential,
    "pareto": parametric.pareto,
    "lognormal": parametric.lognormal,
    "gamma": parametric.gamma,
    "bernoulli": atomic.bernoulli,
    "dropcompute-noise": dropcompute_noise,
    "trace": trace,
}

_TERM_SPLIT = re.compile(r"\+(?=\s*[A-Za-z_])")


def split_terms(text: str, *, what: str) -> list[str]:
    """Split ``A+B+…`` into its terms; an empty term is a malformed spec."""
    form = "name:key=value[+name:key=value…]"
    if not text.strip():
        raise UsageError(f"empty {what}: write it as {form}")
    terms = [term.strip() for term in _TERM_SPLIT.split(text)]
    if any(not term for term in terms) or re.search(r"\+\s*(\+|$)", text):
        raise UsageError(f"malformed {what} {text!r}: an empty term; write it as {form}")
    return terms


def parse_term(text: str) -> DelayModel:
    """One distribution, e.g. ``exp:rate=2``."""
    spec = parse_spec(text, what="delay")
    build = DISTRIBUTIONS.get(spec.name)
    if build is None:
        raise UsageError(
            f"unknown delay distribution {spec.name!r} in {text!r}; "
            f"known: {', '.join(DISTRIBUTIONS)}"
        )
    return build(spec)


def parse_delay(text: str) -> DelayModel:
    """A delay model from its spec; ``A+B`` is the sum of independent terms (see module doc)."""
    terms = [parse_term(term) for term in split_terms(text, what="delay")]
    if len(terms) == 1:
        return terms[0]
    return SumDelay("+".join(term.spec for term in terms), terms)
