"""Names (issue 22): a public top-level class, function or constant is defined in one module
of ``src/tailtrain`` only, so a name found in a traceback, a grep or an import says which
thing it is. Read from the sources by AST: ``def``, ``class`` and module-level assignments
whose name has no leading underscore (imports do not count: importing a name is using it).

The few names that several modules define on purpose are listed below, each with the
modules it is allowed in and why; those modules are left out of the count for that name (a
second definition anywhere else still fails)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "tailtrain"

#: the reproductions of the papers (``reproduce/<paper>.py``)
PAPERS = r"tailtrain\.reproduce\.(dbw|dropcompute|eager|lgc|stale)"

#: the face's wrappers that share a name with the internal function they call
FACE_WRAPPERS = "predict|simulate|compare|train|train_own_model|advise"

#: name (a regular expression, matched whole) -> (modules, a regular expression matched
#: whole, in which it may repeat; why sameness is the point there)
PROTOCOL: dict[str, tuple[str, str]] = {
    # each subcommand module offers the same two functions, which ``cli/__init__.py`` calls
    # as ``module.register(sub)`` and ``args.run(args)``; never imported bare
    "register|run": (r"tailtrain\.cli\.\w+", "the subcommand contract"),
    # ``log = logging.getLogger(__name__)``: the logging module's convention, one per module
    "log": (r"tailtrain\..*", "a module's own logger"),
    # each paper's module has the same shape for ``reproduce.registry``, which always names
    # them qualified (``dbw.FIG6, dbw.fig6``): its paper's title, its figures numbered as the
    # paper numbers them, and N, the paper's own symbol for the worker count
    r"PAPER|N|FIG\d+|fig\d+": (PAPERS, "one shape per paper, the paper's own numbering"),
    # ``tailtrain.face``'s wrappers are the public names of the internals they wrap
    # (``_INTERNAL`` maps each to the function of the same name): one name, one thing, seen
    # from the face and from inside
    FACE_WRAPPERS: (
        r"tailtrain\.face",
        "the face's entry for the internal of the same name",
    ),
    # a rank's run in each runtime topology, in the same steps (``start``, ``resume``,
    # ``rounds``, ``failed``, ``finish``: the last three its ``runtime.rank.RankRun``); each
    # module calls only its own, never imports another's
    "start|resume|rounds|failed|finish": (
        r"tailtrain\.runtime\.(allreduce|partial)\.rounds",
        "the steps of a rank's run, one set per topology",
    ),
    # each topology's ledger (``topology/``) offers the same parts, which both engines of that
    # topology import qualified (``partial.round_row``): its record row's columns, those only
    # one engine can fill, the row builders and the run summary; the partial
    # collective's runtime adds wall-clock keys to its ledger's summary
    # each trainer integration (an optional extra, imported as ``tailtrain.lightning`` or
    # ``tailtrain.hf``) names its probe callback as the issue and its users do: the same
    # probe in each trainer's callback protocol, never both imported in one job
    "StragglerProbeCallback": (
        r"tailtrain\.(lightning\.probe|hf\.callback)",
        "the probe as each trainer's callback",
    ),
    "summarise|step_row|round_row|ROW|SIMULATED_ONLY|MEASURED_ONLY": (
        r"tailtrain\.topology\.\w+|tailtrain\.runtime\.partial\.rounds",
        "a topology's ledger, one per topology",
    ),
}

#: duplicates left for later, each in files another branch is rewriting (issue 22): the
#: rename waits for that merge so that both stay small (none left)
PENDING: dict[str, tuple[str, str]] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def defined(tree: ast.Module) -> set[str]:
    """Public names a module defines at its top level."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return {name for name in names if not name.startswith("_")}


def definitions() -> dict[str, list[str]]:
    """Name -> the modules that define it."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in defined(ast.parse(path.read_text())):
            where[name].append(module_name(path))
    return where


def allowed(name: str, module: str) -> bool:
    return any(
        re.fullmatch(names, name) and re.fullmatch(modules, module)
        for names, (modules, _) in {**PROTOCOL, **PENDING}.items()
    )


def duplicates() -> dict[str, list[str]]:
    """Names defined in more than one module, the allowed places left out."""
    found = {
        name: [m for m in modules if not allowed(name, m)]
        for name, modules in definitions().items()
    }
    return {name: modules for name, modules in found.items() if len(modules) > 1}


def test_every_public_name_is_defined_once():
    assert duplicates() == {}, "rename one (a name that says which), or define it once"


def test_every_allowance_is_still_needed():
    """An entry whose names are no longer defined twice, once in its modules, goes."""
    where = definitions()
    for names, (modules, _) in {**PROTOCOL, **PENDING}.items():
        repeats = [
            name
            for name, defining in where.items()
            if re.fullmatch(names, name)
            and len(defining) > 1
            and any(re.fullmatch(modules, m) for m in defining)
        ]
        assert repeats, f"{names!r} is no longer repeated in {modules}: drop the entry"


def test_the_finder_sees_functions_classes_and_constants():
    tree = ast.parse("import os\nA = 1\nB: int = 2\n_C = 3\ndef f(): ...\nclass K: ...\n")
    assert defined(tree) == {"A", "B", "f", "K"}


def test_the_face_shares_names_only_with_what_it_wraps():
    import tailtrain

    for name in FACE_WRAPPERS.split("|"):
        assert tailtrain._INTERNAL[name][1] == name, f"tailtrain.face.{name} wraps another name"
