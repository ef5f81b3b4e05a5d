"""The documentation's commands stay valid: every example parses, every strategy has a page,
the README keeps its two set-up commands and stays a short path into the site, and the site
with its API reference builds without a warning."""

from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tailtrain.cli import build_parser
from tailtrain.strategies.registry import BUILDERS, parse_strategies, parse_strategy
from tailtrain.tasks.registry import KNOWN_TASKS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
README = ROOT / "README.md"
#: the command-line reference, where a user looks up a spec's options
CLI = DOCS / "cli.md"
#: the trainer integrations, each a public face of its own behind an extra
EXTRAS = ("tailtrain.hf", "tailtrain.lightning")


def commands(page: Path) -> list[list[str]]:
    """The `tailtrain ...` commands of a page's bash blocks, continuation lines joined, each
    up to a shell redirection or pipe (the shell's, not the command's)."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)
    text = "\n".join(blocks).replace("\\\n", " ")
    found = [shlex.split(line)[1:] for line in text.splitlines() if line.startswith("tailtrain ")]
    shell = {">", ">>", "<", "|", "&&", ";"}
    return [list(itertools.takewhile(lambda word: word not in shell, argv)) for argv in found]


def test_every_strategy_has_a_page():
    assert {p.stem for p in (DOCS / "strategies").glob("*.md")} == set(BUILDERS)


def test_the_cli_references_strategy_list_names_every_strategy():
    listed = CLI.read_text().split("- **Strategies**", 1)[1].split("- **Tasks**", 1)[0]
    named = set(re.findall(r"^\s+- `([a-z-]+)", listed, flags=re.M))
    named |= set(re.findall(r"`([a-z-]+)[:[`]", listed))
    assert set(BUILDERS) - named == set()


def test_the_cli_references_task_list_names_every_built_in_task():
    listed = CLI.read_text().split("- **Tasks**", 1)[1].split("- **Partitions**", 1)[0]
    assert set(KNOWN_TASKS) - set(re.findall(r"`([a-z0-9-]+)[:[`]", listed)) == set()


def test_the_readme_keeps_its_two_set_up_commands_and_stays_short():
    """The first command sets up and runs the main job, the second is what CI runs (.ci/run,
    less pip's -q); everything past the loop belongs on the site (docs/)."""
    readme = README.read_text()
    blocks = [b.strip() for b in re.findall(r"```bash\n(.*?)```", readme, flags=re.S)]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert blocks[1] == ci.replace("pip install -q ", "pip install ")
    assert blocks[0].startswith("python3 -m venv .venv && .venv/bin/pip install")
    assert "&& .venv/bin/tailtrain compare " in blocks[0]
    assert len(readme.splitlines()) <= 250


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_example_commands_parse(page):
    found = commands(page)
    if page.parent.name == "strategies":
        assert any(argv[0] == "simulate" for argv in found), "a strategy page needs an example"
    for argv in found:
        args = build_parser().parse_args(argv)
        if getattr(args, "strategy", None):
            assert parse_strategy(args.strategy).name == page.stem or page.stem not in BUILDERS
        if getattr(args, "strategies", None):
            assert parse_strategies(args.strategies)


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_docs_point_only_inside_the_repository(page):
    text = page.read_text()
    assert "shared/papers" not in text and "/work/" not in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert (page.parent / target).exists(), target


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The site built once for this module's checks: its folder and the build's outcome."""
    out = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=170)
    return out, done


@pytest.mark.timeout(180)
def test_site_and_api_reference_build_without_warnings(site):
    """mkdocs.yml is strict: a griffe warning (a docstring naming a parameter the signature
    lacks), a broken cross-reference or link, or a page left out of the nav fails the build."""
    out, done = site
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    assert (out / "api" / "index.html").read_text().count('id="tailtrain.') > 20


#: a Sphinx role the renderer leaves raw (mkdocstrings reads ``[name][tailtrain.X]``)
RAW_ROLE = re.compile(r":(?:func|class|meth|data|mod|attr|obj|exc):<code>")
#: a reference to the project's tracker, meaningless to a reader of the site
TRACKER = re.compile(r"\b[Ii]ssues? \d+|(?<![&\w])#\d+\b")


@pytest.mark.timeout(180)
def test_rendered_pages_hold_no_raw_roles_nor_tracker_references(site):
    """What the site shows a reader: cross-references render as links, and nothing points at
    the tracker (paper citations stay)."""
    out, done = site
    assert done.returncode == 0, done.stderr[-3000:]
    found = []
    for page in sorted(out.rglob("*.html")):
        html = re.sub(r"<script.*?</script>", "", page.read_text(), flags=re.S)
        words = re.sub(r"<[^>]*>", " ", html)  # the text a reader sees, not anchors' ids
        hits = [*RAW_ROLE.finditer(html), *TRACKER.finditer(words)]
        found += [f"{page.relative_to(out)}: {m.group(0)}" for m in hits]
    assert found == []


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_user_code_uses_only_the_public_face(page):
    """Code a user copies imports `tailtrain` alone, never its internal modules, or the face
    of an extra (`tailtrain.hf`, `tailtrain.lightning`: optional packages `import tailtrain`
    must not import); the library page shows `import tailtrain` itself."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    imports = [line.strip() for b in blocks for line in b.splitlines() if "tailtrain" in line]
    imports = [line for line in imports if line.startswith(("import ", "from "))]
    if page.name == "library.md":
        assert "import tailtrain" in imports
    for line in imports:
        faces = ("from tailtrain import ", *(f"from {extra} import " for extra in EXTRAS))
        assert line == "import tailtrain" or line.startswith(faces), line
