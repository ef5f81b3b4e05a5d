"""A strategy's state as a plain state dict: tensors, numbers, strings, lists and dicts.

Checkpoints and the runtime's ranks carry rule states this way, so that
``torch.load(path, weights_only=True)`` reads them back: no pickle of our classes. States are
frozen dataclasses of numbers, tuples, numpy arrays, enums and nested states; each is written
with a ``"__kind__"`` tag, and arrays become flat lists with their dtype and shape (exactly,
bit for bit: a Python float holds a float64). Only classes of
the ``tailtrain`` package are rebuilt on load, and only dataclasses and enums among them.

Hand-written because ``dataclasses.asdict`` loses the types needed to rebuild a state and
pickle is what ``weights_only=True`` exists to refuse.
"""

from __future__ import annotations

import dataclasses
import importlib
from enum import Enum
from typing import Any

import numpy as np

from tailtrain.errors import UsageError

KIND = "__kind__"
_PACKAGE = "tailtrain."


def to_state_dict(value: Any) -> Any:
    """``value`` as nested plain containers that ``torch.load(weights_only=True)`` accepts."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        # Python floats and ints hold float64 / int64 values exactly; no torch in rules
        data = value.ravel().tolist()
        return {KIND: "ndarray", "dtype": value.dtype.str, "shape": list(value.shape), "data": data}
    if isinstance(value, Enum):
        return {KIND: "enum", "type": _name(type(value)), "value": value.value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: to_state_dict(getattr(value, f.name)) for f in _fields(type(value))}
        return {KIND: "dataclass", "type": _name(type(value)), "fields": fields}
    if isinstance(value, tuple):
        return {KIND: "tuple", "items": [to_state_dict(v) for v in value]}
    if isinstance(value, list):
        return [to_state_dict(v) for v in value]
    if isinstance(value, dict):
        items = [[to_state_dict(k), to_state_dict(v)] for k, v in value.items()]
        return {KIND: "dict", "items": items}
    raise TypeError(f"cannot write a {type(value).__name__} into a strategy state dict")


def from_state_dict(data: Any) -> Any:
    """The value :func:`to_state_dict` wrote."""
    if isinstance(data, list):
        return [from_state_dict(v) for v in data]
    if not isinstance(data, dict):
        return data
    kind = data.get(KIND)
    if kind == "ndarray":
        array = np.array(data["data"], dtype=np.dtype(data["dtype"]))
        return array.reshape(data["shape"])
    if kind == "tuple":
        return tuple(from_state_dict(v) for v in data["items"])
    if kind == "dict":
        return {from_state_dict(k): from_state_dict(v) for k, v in data["items"]}
    if kind == "enum":
        return _class(data["type"], Enum)(data["value"])
    if kind == "dataclass":
        cls = _class(data["type"], None)
        values = {k: from_state_dict(v) for k, v in data["fields"].items()}
        return cls(**values)
    raise UsageError(f"not a tailtrain strategy state: unknown entry kind {kind!r}")


def _fields(cls: type) -> tuple[dataclasses.Field, ...]:
    fields = dataclasses.fields(cls)
    if any(not f.init for f in fields):
        raise TypeError(f"{cls.__name__} has fields set outside __init__; cannot rebuild it")
    return fields


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _class(name: str, base: type | None) -> type:
    """A dataclass or enum of this package, by ``module:qualname``; nothing else is loaded."""
    module, _, qualname = str(name).partition(":")
    if not module.startswith(_PACKAGE):
        raise UsageError(f"strategy state names {name!r}, which is not a tailtrain class")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise UsageError(f"strategy state names {name!r}, which does not exist") from None
    ok = dataclasses.is_dataclass(obj) if base is None else issubclass(obj, base)
    if not isinstance(obj, type) or not ok:
        raise UsageError(f"strategy state names {name!r}, which is not a state class")
    return obj
