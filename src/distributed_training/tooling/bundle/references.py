"""`${...}` references: their syntax, what each points at in a target, and substituting the known ones.

A reference is `${root.name.name[0]...}`; each name is letters, then letters or digits, optionally joined by `-`
or `_` (any script's letters, as the CLI reads them: `${var.变量}` is fine; an emoji or a letter written with a
combining accent is not). The CLI resolves six roots: `var` (short for `variables.<name>.value`), `variables`,
`bundle`, `workspace`, `resources`, `artifacts` (bundle/config/mutator/resolve_variable_references.go). Text that is
no reference (`${env:HOME}`), or one with another root (`${HOME}`), the CLI leaves as it is (libs/dyn/dynvar/ref.go,
resolve.go): a warning, since it is mostly a typo, and Spark or a shell may read it on purpose.

In a target, a reference is one of: resolved (a value this module can compute now), known later (a lookup
variable, a resource id, the deploying user: the CLI fills them in at deploy time), or broken (a finding).
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Mapping

from ...findings import Finding
from .config_fields import unknown_field
from .paths import Path, format_path, get_at, walk_strings
from .variables import Variable

KNOWN_ROOTS = ("var", "variables", "bundle", "workspace", "resources", "artifacts")
# The fields of a variable's declaration that `${variables.<name>.<field>}` may name (bundle/config/variable/
# variable.go, Variable).
VARIABLE_FIELDS = ("type", "default", "description", "value", "lookup")

_LETTER = r"[^\W\d_]"
_LETTER_OR_DIGIT = r"[^\W_]"
_NAME = rf"{_LETTER}+(?:[-_]*{_LETTER_OR_DIGIT}+)*"
_SEGMENT = rf"{_NAME}(?:\[\d+\])*"
_VALID_INSIDE = re.compile(rf"{_SEGMENT}(?:\.{_SEGMENT})*")
# Anything that looks like a reference, valid or not; `{{job.id}}`-style dynamic values are another syntax.
_ANY_REFERENCE = re.compile(r"\$\{([^${}]*)\}")
_PART = re.compile(rf"({_NAME})|\[(\d+)\]")


@dataclass(frozen=True)
class Reference:
    text: str  # as written, `${var.x}`
    path: Path | None  # ("var", "x"); None when the text is not a valid reference


def references_in(value: str) -> list[Reference]:
    found = []
    for match in _ANY_REFERENCE.finditer(value):
        inside = match.group(1)
        path = _parse(inside) if _VALID_INSIDE.fullmatch(inside) else None
        found.append(Reference(match.group(0), path))
    return found


def _parse(inside: str) -> Path:
    return tuple(name if name else int(index) for name, index in _PART.findall(inside))


# What a reference resolves to in one target.
RESOLVED, LATER, BROKEN = "resolved", "later", "broken"


@dataclass(frozen=True)
class Resolution:
    state: str  # RESOLVED, LATER or BROKEN
    value: Any = None
    rule: str = ""  # for BROKEN: the rule id of the finding
    message: str = ""
    fix: str = ""
    severity: str = "error"


class Resolver:
    """Resolve references against one target's tree (see `Bundle.target_tree`) and its variables."""

    def __init__(self, tree: Mapping, target: str, variables: dict[str, Variable]):
        self.tree = tree
        self.target = target
        self.variables = variables

    def resolve(self, path: Path) -> Resolution:
        root = path[0]
        if root == "var":
            return self._variable(path)
        if root == "variables":
            return self._declaration(path)
        if root == "resources":
            return self._resource(path)
        if root == "artifacts":
            return self._artifact(path)
        if root == "bundle" and path[1:] == ("target",):
            return Resolution(RESOLVED, self.target)
        if root in ("bundle", "workspace"):
            return self._config_field(path)
        return Resolution(BROKEN, rule="unknown-reference-root", severity="warning",
                          message=f"its root {root!r} is not one the CLI resolves, so the text stays as it is",
                          fix=f"references start with one of {', '.join(KNOWN_ROOTS)}, e.g. ${{var.name}}; leave it "
                              "if the text is meant for Spark or a shell")

    def _declaration(self, path: Path) -> Resolution:
        """`${variables.<name>.value...}` is `${var.<name>...}`; the declaration's other fields resolve as written."""
        if len(path) > 2 and path[2] == "value":
            return self._variable(("var", path[1], *path[3:]))
        if len(path) > 2 and path[1] in self.variables and path[2] not in VARIABLE_FIELDS:
            return Resolution(BROKEN, rule="reference-does-not-exist",
                              message=f"a variable has no field {path[2]!r}, so the CLI stops with \"reference does "
                                      "not exist\"", fix=f"use one of {', '.join(VARIABLE_FIELDS)}")
        if len(path) < 2 or path[1] not in self.variables:
            return self._variable(("var", *path[1:2]))
        return self._from_tree(path)

    def _variable(self, path: Path) -> Resolution:
        name = path[1] if len(path) > 1 else None
        if name not in self.variables:
            declared = ", ".join(sorted(self.variables)) or "none"
            written = get_at(self.tree, ("variables", name), _MISSING) if name is not None else _MISSING
            if written is not _MISSING:  # a value where a declaration goes: the CLI's loader drops it
                return Resolution(BROKEN, rule="undefined-variable",
                                  message=f"variable {name!r} is written as {written!r}, not as a declaration, so the "
                                          "CLI drops it (\"expected map\") and stops here",
                                  fix=f"declare it as variables: {{{name}: {{default: {written!r}}}}}")
            return Resolution(BROKEN, rule="undefined-variable",
                              message=f"variable {name!r} is not declared (declared: {declared})",
                              fix=f"declare {name!r} under the top-level variables (with a default), or fix the name")
        variable = self.variables[name]
        if variable.is_lookup or not variable.has_value:
            return Resolution(LATER)
        value = get_at(variable.value, path[2:], _MISSING)
        if value is _MISSING:
            return Resolution(BROKEN, rule="undefined-variable",
                              message=f"variable {name!r} has no {format_path(path[2:])!r} in its value",
                              fix="use a key (or index) that its value has")
        return Resolution(RESOLVED, value)

    def _resource(self, path: Path) -> Resolution:
        resources = self.tree.get("resources") if isinstance(self.tree.get("resources"), dict) else {}
        if len(path) >= 2 and any(isinstance(of_kind, dict) and path[1] in of_kind for of_kind in resources.values()):
            kind = next(kind for kind, of_kind in resources.items() if isinstance(of_kind, dict) and path[1] in of_kind)
            return Resolution(BROKEN, rule="resource-reference-without-type", severity="warning",
                              message=f"names resource {path[1]!r} without its type",
                              fix=f"write ${{resources.{kind}.{format_path(path[1:])}}}")
        if len(path) < 3 or get_at(resources, path[1:3], _MISSING) is _MISSING:
            defined = sorted(f"{kind}.{key}" for kind, of_kind in resources.items() if isinstance(of_kind, dict)
                             for key in of_kind)
            return Resolution(BROKEN, rule="dangling-resource-reference",
                              message=f"points at no resource of this bundle (defined: {', '.join(defined) or 'none'})",
                              fix="write ${resources.<type>.<key>.<field>}, e.g. ${resources.jobs.train.id}, "
                                  "with a type and key defined under resources")
        return self._from_tree(path)

    def _artifact(self, path: Path) -> Resolution:
        artifacts = self.tree.get("artifacts") if isinstance(self.tree.get("artifacts"), dict) else {}
        if len(path) < 2 or path[1] not in artifacts:
            return Resolution(BROKEN, rule="dangling-artifact-reference",
                              message=f"points at no artifact (defined: {', '.join(sorted(artifacts)) or 'none'})",
                              fix="use a key defined under artifacts")
        return self._from_tree(path)

    def _config_field(self, path: Path) -> Resolution:
        """`${bundle.…}`/`${workspace.…}`: a field of the CLI's structs (see `config_fields`), else broken."""
        unknown = unknown_field(path)
        if unknown is None:
            return self._from_tree(path)
        index, known = unknown
        where, name = format_path(path[:index]), path[index]
        fix = (f"use one of the fields of {where}: {', '.join(known)}" if known
               else f"use {where} itself (it has no fields)")
        close = difflib.get_close_matches(str(name), known, n=1)
        if close:
            fix = f"did you mean ${{{format_path((*path[:index], close[0]))}}}? Else {fix}"
        return Resolution(BROKEN, rule="reference-does-not-exist",
                          message=f"{where} has no field {name!r} in the CLI's configuration, so the CLI stops with "
                                  "\"reference does not exist\"", fix=fix)

    def _from_tree(self, path: Path) -> Resolution:
        value = get_at(self.tree, path, _MISSING)
        return Resolution(LATER) if value is _MISSING else Resolution(RESOLVED, value)


_MISSING = object()


def reference_findings(tree: Mapping, resolver: Resolver) -> list[Finding]:
    """A finding for every malformed or broken reference in a target tree (path set, file left to the caller)."""
    findings = []
    for path, value in walk_strings(tree, containing="${"):  # no reference in a value without it
        for reference in references_in(value):
            where = format_path(path)
            if reference.path is None:
                findings.append(_malformed(reference.text, where))
                continue
            resolution = resolver.resolve(reference.path)
            if resolution.state == BROKEN:
                findings.append(Finding(resolution.rule, f"{reference.text}: {resolution.message}", resolution.fix,
                                        path=where, severity=resolution.severity))
    return findings


def _malformed(text: str, where: str) -> Finding:
    left = "; the CLI leaves the text as it is"
    if unicodedata.normalize("NFC", text) != text:
        return Finding("invalid-reference", f"{text} is not a valid reference: a name holds a combining character "
                       f"(a letter written in decomposed, NFD form){left}",
                       "retype the name with precomposed letters (NFC), or use ASCII names", path=where,
                       severity="warning")
    return Finding("invalid-reference", f"{text} is not a valid reference: names are letters, then letters, digits, "
                   f"'-' or '_', joined by '.', with optional [index]{left}",
                   "write it like ${var.my_name} or ${resources.jobs.train.id}; leave it if the text is meant for "
                   "Spark or a shell", path=where, severity="warning")


def substitute(tree: Any, resolver: Resolver, rounds: int = 10) -> Any:
    """The tree with every resolvable reference replaced (repeatedly, for values that hold references)."""
    for _ in range(rounds):
        changed: list[bool] = []
        tree = _substitute_once(tree, resolver, changed)
        if not changed:  # the copy equals the tree it was made from
            return tree
    return tree


def _substitute_once(node: Any, resolver: Resolver, changed: list[bool]) -> Any:
    """A copy of `node` with its references replaced once; `changed` gets an entry for each value that differs."""
    if isinstance(node, dict):
        return {key: _substitute_once(value, resolver, changed) for key, value in node.items()}
    if isinstance(node, list):
        return [_substitute_once(item, resolver, changed) for item in node]
    if isinstance(node, str) and "${" in node:
        substituted = _substitute_string(node, resolver)
        if substituted != node:
            changed.append(True)
        return substituted
    return node


def _substitute_string(text: str, resolver: Resolver) -> Any:
    references = [reference for reference in references_in(text) if reference.path is not None]
    if len(references) == 1 and references[0].text == text:
        resolution = resolver.resolve(references[0].path)
        return resolution.value if resolution.state == RESOLVED else text
    for reference in references:
        resolution = resolver.resolve(reference.path)
        if resolution.state == RESOLVED and isinstance(resolution.value, (str, int, float, bool)):
            text = text.replace(reference.text, _as_text(resolution.value))
    return text


def _as_text(value: str | int | float | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
