r"""The one applier of ``advise``'s edits: a script's source in, the adopted source out.

``advise --json`` gives ``adopt.edits`` (``advice.adopt``); :func:`apply_edits` applies them
in order, and ``advise --patch SCRIPT`` prints the unified diff. Each edit:

* ``anchor``: a regex (multi-line mode) the supported loop shape contains. Canonical names
  (``advice.adopt.CANONICAL``) already bound are replaced by the script's own before the
  search; a named group named after a canonical name binds it (``(?P<loader>...)`` on
  ``self.train_data = DataLoader(...)`` binds ``loader`` to ``self.train_data``).
* ``action``: ``insert_after`` inserts ``lines`` after the anchored statement (the whole
  statement, by the parser, when it spans lines) at its indentation, or after a line an
  earlier edit inserted that assigns a name these lines use, when that comes later in the
  same block (the hook after the rebalanced loader); ``replace`` puts ``lines`` in place of
  the lines the match spans, ``\g<name>`` standing for a group's text (its further lines
  keep their indentation relative to its first).
* ``renames``: canonical name -> new name; in a group's text the script's own name for it
  becomes the new one (a step's forward on the micro-batch, not on the batch it came from).
* ``lines`` use canonical names, renamed to the script's; a name the edits introduce
  (``state``, ``probe``) lives where the DDP model does (``self.state`` beside ``self.model``).
* ``unless`` / ``why``: a regex a shape the edit cannot change contains, and why (one line).
* ``plain``: a canonical name the edit needs in the anchor's scope: the edit is skipped
  where the anchor is absent, or the anchored statement's function (or module) does not
  assign that name, as a plain name, before it (``del ddp`` before
  ``destroy_process_group()``: a ``Trainer`` keeping ``self.model``, a ``cleanup()`` helper
  or a ``__main__`` block calling it where ``ddp`` is not).

Everything that does not fit is a one-line :class:`~tailtrain.errors.UsageError`.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Sequence
from typing import Any

from tailtrain.advice.adopt import CANONICAL
from tailtrain.errors import UsageError

#: names the edits introduce, placed beside the object they belong to (module docstring)
INTRODUCED = {"state": "ddp", "probe": "ddp"}
_GROUP = re.compile(r"\\g<(\w+)>")
#: a string literal of a printed line (no escapes in the lines advise prints)
_STRING = re.compile(r"(\"[^\"]*\"|'[^']*')")


def _token(name: str) -> re.Pattern[str]:
    """``name`` as an identifier: not an attribute, a longer name or a group's name."""
    return re.compile(rf"(?:(?<=\\b)|(?<![\w.<=\\])){re.escape(name)}(?![\w>])")


def _renamed(text: str, names: dict[str, str], regex: bool = False) -> str:
    """``text`` with each bound canonical name as the script's own; in a line of code
    (``regex`` False) string literals keep their text (``"runs/probe"``)."""
    if regex:
        return _substitute(text, {name: re.escape(own) for name, own in names.items()})
    parts = _STRING.split(text)  # odd parts are the literals
    return "".join(p if i % 2 else _substitute(p, names) for i, p in enumerate(parts))


def _substitute(text: str, names: dict[str, str]) -> str:
    for name, own in names.items():
        if own != name:
            text = _token(name).sub(own.replace("\\", "\\\\"), text)
    return text


def _statement_end(source: str, line: int) -> int:
    """The last line (0-based) of the simple statement that starts on ``line`` (a compound
    one, ``for`` or ``def``, is anchored by its header); ``line`` when none does or the
    source does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return line
    ends = [
        node.end_lineno - 1
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt)
        and node.lineno - 1 == line
        and node.end_lineno is not None
        and not hasattr(node, "body")
    ]
    return max(ends, default=line)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _rebound(text: str, renames: dict[str, str]) -> str:
    """``text`` (code) with each name of ``renames`` read or bound under its new name, but not
    where it names a keyword argument (``ddp(input=x)``: ``input`` stays, ``x`` is renamed)
    or an attribute; string literals keep their text."""

    def rename(part: str) -> str:
        for old, new in renames.items():
            name = re.escape(old)
            # a keyword's name follows "(" or "," and precedes "=" (not "=="): kept as it is
            found = re.compile(rf"(?P<keyword>[(,]\s*){name}(?=\s*=(?!=))|(?<![\w.]){name}(?!\w)")
            part = found.sub(lambda m, new=new: m.group(0) if m.group("keyword") else new, part)
        return part

    parts = _STRING.split(text)  # odd parts are the literals
    return "".join(p if i % 2 else rename(p) for i, p in enumerate(parts))


def _expand(
    template: str, match: re.Match[str], base: str, renames: dict[str, str] | None = None
) -> list[str]:
    """``template`` with each ``\\g<name>`` replaced by the group's text (its names
    ``renames``d, :func:`_rebound`): its first line in place, its further lines re-indented
    from ``base`` to the template line's indentation."""
    found = _GROUP.search(template)
    if found is None:
        return [template]
    text = _rebound(match.group(found.group(1)) or "", renames or {})
    head, *rest = text.split("\n")
    prefix = _indent(template)
    out = [template[: found.start()] + head + template[found.end() :]]
    for line in rest:
        out.append(prefix + line[len(base) :] if line.startswith(base) else prefix + line)
    return out


def apply_edits(source: str, edits: Sequence[dict[str, Any]]) -> str:
    """``source`` with ``edits`` (``advise --json``'s ``adopt.edits``) applied in order,
    names renamed to the script's own (module docstring)."""
    names: dict[str, str] = {}
    assigned: dict[str, str] = {}  # canonical name -> the inserted line assigning it
    for edit in edits:
        unless = edit.get("unless")
        if unless and re.search(unless, source, re.M):
            raise UsageError(str(edit.get("why") or f"the script matches {unless!r}"))
        anchor = _renamed(edit["anchor"], names, regex=True)
        match = re.search(anchor, source, re.M)
        plain = edit.get("plain")
        if plain and (
            match is None
            or not _assigned_before(
                source, source.count("\n", 0, match.start()), names.get(plain, plain)
            )
        ):
            continue  # an optional edit that this script's shape does not take (docstring)
        if match is None:
            raise UsageError(
                f"no line of the script matches {edit['anchor']!r} (binds "
                f"{edit.get('binds')}): the script is not a loop shape advise --for names; "
                "adopt the printed lines by hand"
            )
        for group, value in match.groupdict().items():
            if group in CANONICAL and value:
                names[group] = value
        for name, owner in INTRODUCED.items():
            if owner in names and "." in names[owner]:
                names[name] = names[owner].rsplit(".", 1)[0] + "." + name
        lines = source.split("\n")
        first = source.count("\n", 0, match.start())
        last = source.count("\n", 0, match.end())
        base = _indent(lines[first])
        renames = {names[c]: new for c, new in edit.get("renames", {}).items() if c in names}
        rendered: list[str] = []
        for template in edit["lines"]:
            expanded = _expand(_renamed(template, names), match, base, renames)
            rendered += [base + part for part in expanded]
        if edit["action"] == "replace":
            lines[first : last + 1] = rendered
        elif edit["action"] == "insert_after":
            end = max(_statement_end(source, first), last)
            end = _after_assignments(lines, end, base, edit["lines"], assigned)
            lines[end + 1 : end + 1] = rendered
        else:
            raise UsageError(f"unknown edit action {edit['action']!r}: insert_after or replace")
        for template, line in zip(edit["lines"], rendered, strict=False):
            target = re.match(r"(\w+) = ", template)
            if target is not None and edit["action"] == "insert_after":
                assigned[target.group(1)] = line
        source = "\n".join(lines)
    return source


def _scoped(node: ast.AST, scope: ast.AST) -> Any:
    """(node, the innermost function, class or module holding it) for every node below."""
    for child in ast.iter_child_nodes(node):
        yield child, scope
        owner = (
            child
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
            else scope
        )
        yield from _scoped(child, owner)


def _assigned_before(source: str, line: int, name: str) -> bool:
    """Whether a statement starts on ``line`` (0-based) and its function (or the module)
    assigns the plain name ``name`` on an earlier line, with no ``del`` of it after that
    assignment (``plain`` edits: a script that already deletes its DDP model there needs no
    second ``del``, which would raise)."""
    if not name.isidentifier():
        return False
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    found = [(n, s) for n, s in _scoped(tree, tree)]
    owner = next((s for n, s in found if isinstance(n, ast.stmt) and n.lineno - 1 == line), None)
    if owner is None:
        return False
    last: tuple[int, bool] | None = None  # the latest (line, assigns) before ``line``
    for node, scope in found:
        if scope is not owner or not isinstance(node, ast.stmt) or node.lineno - 1 >= line:
            continue
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        named = any(isinstance(t, ast.Name) and t.id == name for t in targets)
        if named and (last is None or node.lineno >= last[0]):
            last = (node.lineno, not isinstance(node, ast.Delete))
    return last is not None and last[1]


def _after_assignments(
    lines: list[str], end: int, base: str, templates: Sequence[str], assigned: dict[str, str]
) -> int:
    """Where lines using a name an earlier edit assigned go: after that assignment when it
    comes later at the same indentation (module docstring)."""
    for name, line in assigned.items():
        uses = any(_token(name).search(t) for t in templates)
        if not uses or _indent(line) != base:
            continue
        later = [i for i in range(end + 1, len(lines)) if lines[i] == line]
        if later:
            end = later[0]
    return end


def unified_diff(source: str, patched: str, name: str) -> str:
    """The change as ``diff -u`` prints it (``advise --patch``)."""
    return "".join(
        difflib.unified_diff(
            source.splitlines(keepends=True),
            patched.splitlines(keepends=True),
            fromfile=f"a/{name}",
            tofile=f"b/{name}",
        )
    )
