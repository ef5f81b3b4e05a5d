"""``tailtrain.tasks`` loads its names on first use (issue 35 item 6): each public name
resolves, its table and its TYPE_CHECKING block agree, and taking the light ``stream`` or
``partition`` loads no built-in task."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tailtrain.tasks as tasks


@pytest.mark.parametrize("name", tasks.__all__)
def test_every_public_name_resolves(name):
    assert getattr(tasks, name) is getattr(importlib.import_module(tasks._NAMES[name]), name)
    assert name in dir(tasks)


def test_the_table_the_type_checking_block_and_all_agree():
    tree = ast.parse(Path(tasks.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n))
    imported = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == tasks._NAMES
    assert sorted(tasks.__all__) == sorted(tasks._NAMES)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = tasks.nothing


def test_the_stream_loads_no_built_in_task():
    code = (
        "import sys\nfrom tailtrain.tasks.stream import deal\n"
        "from tailtrain.tasks import parse_partition\n"
        "import json\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('tailtrain.tasks.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["tailtrain.tasks.partition", "tailtrain.tasks.stream"]
