"""Import circles inside ``runtime/`` (issue 35 item 5): read from the sources by AST, every
``import``/``from`` statement counted, lazy in-function ones and type-only ones under
``if TYPE_CHECKING:`` included, so a circle that Python tolerates today (one side imports
lazily) is still seen. None is left (the last two, a host's state named in a helper's type
hints, went with ``ps.state``); a new one fails here.

Run as a script to list them: ``python tests/runtime/test_import_circles.py [SRC]``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).parents[2] / "src"


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_only(tree: ast.Module) -> set[ast.AST]:
    """The import statements under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    found: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
            if name == "TYPE_CHECKING":
                found.update(n for s in node.body for n in ast.walk(s))
    return found


def import_graph(package: Path, src: Path) -> dict[str, dict[str, bool]]:
    """Module -> {imported module inside ``package``: whether only type hints use it}."""
    paths = {module_name(p, src): p for p in sorted(package.rglob("*.py"))}
    graph: dict[str, dict[str, bool]] = {}
    for name, path in paths.items():
        anchor = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        typed = _type_only(tree)
        edges: dict[str, bool] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = anchor.split(".")[: len(anchor.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                if target in paths and target != name:
                    edges[target] = edges.get(target, True) and node in typed
        graph[name] = edges
    return graph


def circles(package: Path, src: Path = SRC) -> list[list[tuple[str, bool]]]:
    """Every elementary circle of ``package``'s import graph, each as its (module, whether
    the import of the next one is type-only) steps, from its first module in sorted order."""
    graph = import_graph(package, src)
    order = {name: i for i, name in enumerate(sorted(graph))}
    found: list[list[tuple[str, bool]]] = []

    def walk(start: str, path: list[tuple[str, bool]], seen: set[str]) -> None:
        here = path[-1][0]
        for target, typed in sorted(graph[here].items()):
            steps = [*path[:-1], (here, typed)]
            if target == start:
                found.append(steps)
            elif target not in seen and order[target] > order[start]:
                walk(start, [*steps, (target, False)], seen | {target})

    for start in sorted(graph):
        walk(start, [(start, False)], {start})
    return found


def line(circle: list[tuple[str, bool]], prefix: str) -> str:
    steps = [f"{n.removeprefix(prefix)} {'-(type)->' if t else '->'}" for n, t in circle]
    return " ".join(steps) + f" {circle[0][0].removeprefix(prefix)}"


def test_runtime_has_no_import_circle():
    """A helper names its host's state by a protocol below it (``ps.state.ServerState``,
    ``allreduce.state.AllreduceRank``), never the host module, even in type hints."""
    found = circles(SRC / "tailtrain" / "runtime")
    assert found == [], "\n".join(line(c, "tailtrain.runtime.") for c in found)


def test_the_finder_sees_a_lazy_circle_and_a_type_only_one(tmp_path):
    """The check above can fail: a circle closed by an in-function import is found, and an
    import under ``if TYPE_CHECKING:`` is marked type-only."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import x\n")
    (package / "b.py").write_text("def x():\n    from pkg import c\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import y\n"
    )
    (package / "d.py").write_text("from . import a\n")
    assert circles(package, tmp_path) == [
        [("pkg.a", False), ("pkg.b", False), ("pkg.c", True)],
    ]


if __name__ == "__main__":
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else SRC
    listed = circles(src / "tailtrain" / "runtime", src)
    for circle in listed:
        print(line(circle, "tailtrain.runtime."))
    print(f"{len(listed)} circles")
