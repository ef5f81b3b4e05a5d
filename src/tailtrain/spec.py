"""Parse the `name:key=value,key=value` specs used for delays, patterns, strategies and tasks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tailtrain.errors import UsageError


@dataclass(frozen=True)
class Spec:
    """A parsed `name:key=value,...` string; values stay strings until a consumer converts them."""

    name: str
    params: dict[str, str] = field(default_factory=dict)
    text: str = ""

    def require_known(self, allowed: Iterable[str]) -> None:
        allowed = set(allowed)
        unknown = sorted(set(self.params) - allowed)
        if unknown:
            hint = ", ".join(sorted(allowed)) or "no parameters"
            raise UsageError(
                f"{self.name!r} does not take parameter {unknown[0]!r} in {self.text!r}; "
                f"it takes: {hint}"
            )

    def has(self, key: str) -> bool:
        return key in self.params

    def get_str(self, key: str, default: str | None = None) -> str:
        if key in self.params:
            return self.params[key]
        if default is None:
            raise UsageError(f"{self.text!r} is missing parameter {key!r}: add {key}=...")
        return default

    def get_float(
        self,
        key: str,
        default: float | None = None,
        *,
        minimum: float | None = None,
        positive: bool = False,
    ) -> float:
        raw = self.params.get(key)
        if raw is None:
            if default is None:
                raise UsageError(f"{self.text!r} is missing parameter {key!r}: add {key}=<number>")
            return default
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"parameter {key}={raw!r} in {self.text!r} is not a number") from None
        if value != value:
            raise UsageError(f"parameter {key} in {self.text!r} is NaN; give a number")
        if positive and not value > 0:
            raise UsageError(f"parameter {key}={raw} in {self.text!r} must be > 0")
        if minimum is not None and value < minimum:
            raise UsageError(f"parameter {key}={raw} in {self.text!r} must be >= {minimum:g}")
        return value

    def get_int(self, key: str, default: int | None = None, *, minimum: int | None = None) -> int:
        raw = self.params.get(key)
        if raw is None:
            if default is None:
                raise UsageError(f"{self.text!r} is missing parameter {key!r}: add {key}=<integer>")
            return default
        try:
            value = int(raw)
        except ValueError:
            raise UsageError(
                f"parameter {key}={raw!r} in {self.text!r} is not an integer"
            ) from None
        if minimum is not None and value < minimum:
            raise UsageError(f"parameter {key}={raw} in {self.text!r} must be >= {minimum}")
        return value


def parse_spec(text: str, *, what: str = "spec") -> Spec:
    """Parse `name` or `name:key=value,key=value` into a :class:`Spec`."""
    text = text.strip()
    if not text:
        raise UsageError(f"empty {what}: write it as name:key=value,...")
    name, _, rest = text.partition(":")
    name = name.strip()
    if not name or any(c in name for c in "=, "):
        raise UsageError(f"malformed {what} {text!r}: write it as name:key=value,...")
    params: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not key or not value:
                raise UsageError(f"malformed {what} {text!r}: {item!r} should be key=value")
            if key in params:
                raise UsageError(f"malformed {what} {text!r}: {key!r} is given twice")
            params[key] = value
    elif text.endswith(":"):
        raise UsageError(f"malformed {what} {text!r}: nothing after ':'")
    return Spec(name=name, params=params, text=text)
