"""A package's public names loaded on first use (PEP 562 ``__getattr__`` and ``__dir__``).

A package that re-exports its modules' names imports every one of them with itself, so the
one light piece a caller needs costs the whole package: a rank restarted to heal that needs
``delays.base`` would import scipy with the samplers (about a second of its heal). A package
that uses this keeps a table, public name -> defining module, and a ``TYPE_CHECKING`` block
naming the same imports for type checkers and readers (``tests/test_lazy.py`` holds the two
together).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose public names are ``names``' keys,
    each defined in the module its value names. A name, once loaded, becomes a plain
    attribute of the package."""

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return getattr_, dir_
