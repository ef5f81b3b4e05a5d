"""``tailtrain.lazy``: a package's names loaded on first use. For each package that uses it, every
public name resolves to its module's object, and the table, the ``TYPE_CHECKING`` block and
``__all__`` name the same things; and a rank's step loads no scipy (it cost a second of every
start and heal of a rank whose own script imports none)."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ("tailtrain.delays", "tailtrain.tasks", "tailtrain.theory")


def names_of(package: str) -> dict[str, str]:
    return importlib.import_module(package)._NAMES


@pytest.mark.parametrize(
    ("package", "name"), [(p, n) for p in PACKAGES for n in sorted(names_of(p))]
)
def test_every_public_name_resolves_to_its_module_s_object(package, name):
    module = importlib.import_module(package)
    defined = getattr(importlib.import_module(module._NAMES[name]), name)
    assert getattr(module, name) is defined
    assert name in dir(module)


@pytest.mark.parametrize("package", PACKAGES)
def test_the_table_the_type_checking_block_and_all_agree(package):
    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n))
    imported = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == module._NAMES
    assert sorted(module.__all__) == sorted(module._NAMES)


@pytest.mark.parametrize("package", PACKAGES)
def test_an_unknown_name_is_an_attribute_error(package):
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        _ = importlib.import_module(package).nothing


def test_a_rank_s_step_loads_no_scipy():
    code = (
        "import sys, json\nfrom tailtrain import StragglerStep, StragglerProbe\n"
        "from tailtrain.integrate import ddp, elastic_ddp\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
