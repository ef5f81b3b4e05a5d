"""A number with the method that produced it and its standard error."""

from __future__ import annotations

from dataclasses import dataclass

EXACT = "exact"
NUMERICAL = "numerical-integration"


def monte_carlo(samples: int, seed: int | None = None) -> str:
    """Method label of a seeded Monte Carlo estimate, e.g. ``monte-carlo(n=4000, seed=0)``."""
    if seed is None:
        return f"monte-carlo(n={samples})"
    return f"monte-carlo(n={samples}, seed={seed})"


@dataclass(frozen=True)
class Estimate:
    """``value`` estimated by ``method``; ``stderr`` is 0 for exact and quadrature results."""

    value: float
    stderr: float = 0.0
    method: str = EXACT

    @property
    def is_monte_carlo(self) -> bool:
        return self.method.startswith("monte-carlo")
