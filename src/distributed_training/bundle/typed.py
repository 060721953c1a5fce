"""Parse every job strictly with the typed classes of the `databricks-bundles` package.

`databricks.bundles.jobs.Job.from_dict` refuses unknown keys and values it cannot convert, and accepts
`${...}` references anywhere. It says what is wrong but not where, so a failing job is narrowed down: its
unknown keys are named directly, sub-mappings (tasks, clusters, ...) are parsed on their own with their own
classes, and for any other error the field of the innermost failing mapping that is to blame is found.
"""

from __future__ import annotations

import typing
from dataclasses import fields, is_dataclass
from typing import Any, Mapping

from ..findings import Finding
from .clusters import jobs_of
from .paths import Path, format_path

INSTALL_HINT = "pip install databricks-bundles"
_PARSE_ERRORS = (ValueError, TypeError, KeyError, AttributeError)


def typed_findings(tree: Mapping, parsed: dict[int, tuple[Any, list[Finding]]] | None = None) -> list[Finding]:
    """Findings for every job of a target tree that the typed classes refuse (or one warning without them).

    `parsed`: the findings of jobs already parsed, by the id of their mapping, shared between the targets of one
    bundle: a job that a target does not override is the same mapping in every target, and parsing it is most of
    the time `validate` takes on a large bundle. (Each entry keeps its mapping alive, so an id is never reused.)"""
    try:
        from databricks.bundles.jobs import Job
    except ModuleNotFoundError:
        return [Finding("typed-classes-missing", "the databricks-bundles package is not installed: jobs were not "
                        "parsed with the typed resource classes", f"{INSTALL_HINT} (or install the validate extra)",
                        severity="warning")]
    parsed = {} if parsed is None else parsed
    findings = []
    for key, job in jobs_of(tree):
        path = ("resources", "jobs", key)
        known = parsed.get(id(job))
        if known is None or known[0][0] != path:
            known = parsed[id(job)] = ((path, job), _parse(Job, job, path))
        findings += known[1]
    return findings


def _parse(cls: type, value: Any, path: Path) -> list[Finding]:
    try:
        cls.from_dict(value)
        return []
    except _PARSE_ERRORS as error:
        if not isinstance(value, dict):
            return [_finding(cls, value, path, error)]
        blamed = {**_unknown_fields(cls, value, path), **_inner_findings(cls, value, path)}
        if not blamed:
            return [_finding(cls, value, path, error)]
        # The rest of the mapping may hold an error of its own, hidden behind the ones found so far.
        rest = {key: item for key, item in value.items() if key not in blamed}
        return [finding for findings in blamed.values() for finding in findings] + _parse(cls, rest, path)


def _unknown_fields(cls: type, value: dict, path: Path) -> dict[str, list[Finding]]:
    known = {field.name for field in fields(cls)}
    return {key: [Finding("typed", f"unknown field {key!r} for {cls.__name__}",
                          "remove it or fix its name (the typed classes follow the Jobs API)",
                          path=format_path((*path, key)))]
            for key in value if key not in known}


def _inner_findings(cls: type, value: dict, path: Path) -> dict[str, list[Finding]]:
    """Findings from the parts of `value` that fail on their own (nested typed mappings, list items), by key."""
    hints = typing.get_type_hints(cls)
    found = {}
    for key, field_value in value.items():
        container, nested = _field_class(hints.get(key))
        if nested is None:
            continue
        if container == "list" and isinstance(field_value, list):
            parts = [((key, index), item) for index, item in enumerate(field_value)]
        elif container == "dict" and isinstance(field_value, dict):
            parts = [((key, str(name)), item) for name, item in field_value.items()]
        elif container is None:
            parts = [((key,), field_value)]
        else:
            parts = []
        findings = [finding for relative, part in parts if isinstance(part, dict)
                    for finding in _parse(nested, part, (*path, *relative))]
        if findings:
            found[key] = findings
    return found


def _finding(cls: type, value: Any, path: Path, error: Exception) -> Finding:
    field = _failing_field(cls, value)
    where = (*path, field) if field is not None else path
    return Finding("typed", f"{cls.__name__}: {error}", "fix the value to the type the Jobs API expects",
                   path=format_path(where))


def _failing_field(cls: type, value: Any) -> str | None:
    """The field whose removal lets `value` parse (None when no single field is to blame)."""
    if not isinstance(value, dict):
        return None
    for key in value:
        try:
            cls.from_dict({other: item for other, item in value.items() if other != key})
            return key
        except _PARSE_ERRORS:
            continue
    return None


def _field_class(hint: Any) -> tuple[str | None, type | None]:
    """(container, typed class) of a field's type hint: `VariableOrList[Task]` -> ("list", Task),
    `VariableOrOptional[ClusterSpec]` -> (None, ClusterSpec), `VariableOrDict[str]` -> ("dict", None)."""
    origin = typing.get_origin(hint)
    if getattr(origin, "__name__", "") == "Variable":  # the `${...}` alternative of every field
        return None, None
    if is_dataclass(hint) and hasattr(hint, "from_dict"):
        return None, hint
    if origin in (list, dict):
        _, cls = _field_class(typing.get_args(hint)[-1])
        return origin.__name__, cls
    for argument in typing.get_args(hint):
        container, cls = _field_class(argument)
        if cls is not None:
            return container, cls
    return None, None
