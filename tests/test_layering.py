"""Layering (issue 22): the runtime never reaches into the simulator, and ``sim/`` holds only
virtual-clock code. Read from the sources by AST (lazy in-function imports included), and
checked once more on what importing the runtime actually loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "tailtrain"
SIM = "tailtrain.sim"

#: what may import the simulator from outside it: the commands that run it and the papers'
#: figures (whole packages), the public face (its ``simulate``/``compare``, lazily), the plots
#: of its comparisons and predict's measured families
SIM_PACKAGES = ("tailtrain.cli", "tailtrain.reproduce")
SIM_IMPORTERS = {"tailtrain", "tailtrain.face", "tailtrain.plots", "tailtrain.prediction.families"}

#: the virtual-clock modules, all that ``sim/`` should hold
SIM_MODULES = {
    "tailtrain.sim",
    "tailtrain.sim.driver",
    "tailtrain.sim.run",
    "tailtrain.sim.compare",
    "tailtrain.sim.allreduce",
    "tailtrain.sim.allreduce.engine",
    "tailtrain.sim.allreduce.learner",
    "tailtrain.sim.allreduce.timing",
    "tailtrain.sim.partial",
    "tailtrain.sim.partial.collectives",
    "tailtrain.sim.partial.engine",
    "tailtrain.sim.partial.microbench",
    "tailtrain.sim.partial.models",
    "tailtrain.sim.partial.processes",
    "tailtrain.sim.ps",
    "tailtrain.sim.ps.engine",
    "tailtrain.sim.ps.timeline",
    "tailtrain.sim.ps.trainer",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it: ``import a.b``, ``from a import b``
    (as ``a`` and ``a.b``), relative forms resolved, and ``import_module("a.b")``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if called in ("import_module", "__import__") and isinstance(first, ast.Constant):
                found.add(str(first.value))
    return found


def imports_sim(path: Path) -> list[str]:
    return sorted(m for m in imported(path) if m == SIM or m.startswith(SIM + "."))


def modules_under(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (PACKAGE / folder).rglob("*.py"))


@pytest.mark.parametrize(
    "path", modules_under("runtime", "integrate"), ids=lambda p: module_name(p)
)
def test_runtime_and_integrate_never_import_the_simulator(path):
    assert imports_sim(path) == [], f"{module_name(path)} imports the simulator"


def test_only_the_simulators_own_commands_import_it():
    outside = {
        module_name(path): imports_sim(path)
        for path in PACKAGE.rglob("*.py")
        if not module_name(path).startswith(SIM)
    }
    packages = tuple(f"{m}." for m in SIM_PACKAGES)
    wrong = {
        name: sims
        for name, sims in outside.items()
        if sims and name not in SIM_IMPORTERS and not name.startswith(packages)
    }
    assert wrong == {}, "only cli, reproduce, plots and predict's families run the simulator"


def test_sim_holds_only_virtual_clock_modules():
    held = {module_name(path) for path in (PACKAGE / "sim").rglob("*.py")}
    assert held == SIM_MODULES, (
        "sim/ is the virtual clock only: shared run infrastructure goes to core/, delays/, "
        "tasks/ or topology/"
    )


def test_loading_the_runtime_loads_no_simulator_module():
    runtime = [module_name(p) for p in modules_under("runtime", "integrate")]
    code = (
        "import importlib, sys\n"
        f"for name in {runtime!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m == {SIM!r} or m.startswith({SIM + '.'!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


#: what ``import tailtrain.integrate`` (a user's own loop on an allreduce) must not load: the
#: simulator, the parameter server and the partial collective (issue 22 item 6)
NOT_FOR_A_LOOP = (
    SIM,
    "tailtrain.runtime.ps",
    "tailtrain.runtime.partial",
)


def test_importing_integrate_loads_no_other_topology():
    code = (
        "import sys, tailtrain.integrate\n"
        f"print(sorted(m for m in sys.modules if m.startswith({NOT_FOR_A_LOOP!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"import tailtrain.integrate loads {out.stdout.strip()}"


# ---- the elastic floor (issue 35) ----------------------------------------------------------------
#: the runtime's topology wings: each stands on the shared runtime and ``runtime.elastic``,
#: never on another wing
WINGS = ("allreduce", "partial", "ps")
ELASTIC = "tailtrain.runtime.elastic"


def reaches(path: Path, packages: tuple[str, ...]) -> list[str]:
    """The modules of ``packages`` (dotted names) that ``path`` imports."""
    return sorted(
        m for m in imported(path) if any(m == p or m.startswith(p + ".") for p in packages)
    )


@pytest.mark.parametrize(
    "path",
    [p for wing in WINGS for p in modules_under(f"runtime/{wing}")],
    ids=lambda p: module_name(p),
)
def test_a_topology_wing_imports_no_sibling_wing(path):
    own = module_name(path).split(".")[2]
    siblings = tuple(f"tailtrain.runtime.{w}" for w in WINGS if w != own)
    assert reaches(path, siblings) == [], f"{module_name(path)} reaches into another topology"


@pytest.mark.parametrize("path", modules_under("integrate"), ids=lambda p: module_name(p))
def test_a_users_loop_imports_no_topology_wing(path):
    wings = tuple(f"tailtrain.runtime.{w}" for w in WINGS)
    assert reaches(path, wings) == [], f"{module_name(path)} imports a topology: use {ELASTIC}"


#: who takes which elastic decision from where (review E1-E3): the lead, the hand-over and the
#: live world from ``handover``, the refusals from ``refusals``
ELASTIC_USERS = {
    "runtime/allreduce/handover.py": "handover",
    "runtime/allreduce/rounds.py": "handover",
    "runtime/partial/regroup.py": "handover",
    "runtime/partial/rule.py": "handover",
    "integrate/membership.py": "handover",  # the loop entries' part (StragglerStep, DDP hook)
    "runtime/launching/checks.py": "refusals",
}


def test_the_shrink_hosts_stand_on_the_elastic_layer():
    """The hosts of a shrink take their decisions from ``runtime.elastic`` (the table), and
    the elastic layer stands under them all: it imports no topology wing and no
    ``integrate``."""
    for host, room in ELASTIC_USERS.items():
        assert f"{ELASTIC}.{room}" in imported(PACKAGE / host), f"{host} skips {room}"
    assert f"{ELASTIC}.refusals" in imported(PACKAGE / "integrate/step.py")
    below = (*(f"tailtrain.runtime.{w}" for w in WINGS), "tailtrain.integrate")
    for path in modules_under("runtime/elastic"):
        assert reaches(path, below) == [], f"{module_name(path)} reaches up"


#: the runtime's top floor (issue 35 item 5): ``launching`` starts the ranks of every topology
#: and ``drills`` are ``tailtrain bench``'s tools over it; nothing under them reaches up
TOP = ("tailtrain.runtime.launching", "tailtrain.runtime.drills")


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in modules_under("runtime", "integrate")
        if not module_name(p).startswith(TOP) and module_name(p) != "tailtrain.runtime"
    ],
    ids=lambda p: module_name(p),
)
def test_nothing_below_the_launcher_imports_it(path):
    assert reaches(path, TOP) == [], f"{module_name(path)} reaches up into the launcher"


def test_the_launcher_imports_no_drill():
    for path in modules_under("runtime/launching"):
        assert reaches(path, ("tailtrain.runtime.drills",)) == [], f"{module_name(path)}"


#: what ``import tailtrain.integrate`` may load of ``tailtrain.tasks``: the batch dealer its
#: samplers use and the partitions a world names; no built-in task (gpt, cifar10, ...) and no
#: task registry (issue 35 item 6)
TASKS_FOR_A_LOOP = {"tailtrain.tasks", "tailtrain.tasks.partition", "tailtrain.tasks.stream"}


def test_importing_integrate_loads_no_built_in_task():
    code = (
        "import sys, tailtrain.integrate\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('tailtrain.tasks'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert "tailtrain.tasks.stream" in loaded  # the probe sees the package's modules
    assert loaded <= TASKS_FOR_A_LOOP, (
        f"import tailtrain.integrate loads {sorted(loaded - TASKS_FOR_A_LOOP)}"
    )
