"""Parse every job strictly with the typed classes of the `databricks-bundles` package.

`databricks.bundles.jobs.Job.from_dict` refuses unknown keys and values it cannot convert, and accepts
`${...}` references anywhere. It says what is wrong but not where, so a failing job is narrowed down: its
unknown keys are named directly, sub-mappings (tasks, clusters, ...) are parsed on their own with their own
classes, and for any other error the field of the innermost failing mapping that is to blame is found.

`from_dict` finds its way through every field's type hint each time (about a millisecond a job); a job that plainly
parses (`plainly_parses`: known fields, required ones there, values of the hinted kinds) is not handed to it.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Callable, Mapping

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
    if plainly_parses(cls, value):
        return []
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


def plainly_parses(hint: Any, value: Any) -> bool:
    """True where `from_dict` (databricks.bundles.core._transform) surely accepts `value` as `hint`; False where it
    may not, or where this does not follow its rules (then `from_dict` decides). Never True for a value it refuses:
    each kind is as strict as `_transform` or stricter (an int field takes an int, not a numeric string)."""
    return _check_of(hint)(value)


_CHECKS: dict[Any, Callable[[Any], bool]] = {}
_SCALARS = {Any: lambda value: True, str: lambda value: True,  # `str(value)`: anything
            int: lambda value: type(value) is int, bool: lambda value: type(value) is bool,
            float: lambda value: type(value) in (int, float), type(None): lambda value: value is None}


def _check_of(hint: Any) -> Callable[[Any], bool]:
    """The check for a type hint, made once (each check holds its parts' checks: no hint is looked up per value)."""
    check = _CHECKS.get(hint)
    if check is None:
        check = _CHECKS[hint] = _new_check(hint)
    return check


def _is_variable(hint: Any) -> bool:
    return getattr(typing.get_origin(hint), "__name__", "") == "Variable"


def _is_reference(value: Any) -> bool:
    """A whole `${...}` string, which a Variable alternative takes (the package's own test of it)."""
    if not isinstance(value, str) or "${" not in value:
        return False
    from databricks.bundles.core._transform import _unwrap_variable_path

    return _unwrap_variable_path(value) is not None


def _new_check(hint: Any) -> Callable[[Any], bool]:
    if hint in _SCALARS:
        return _SCALARS[hint]
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if _is_variable(hint):
        return _is_reference
    if origin in (typing.Union, types.UnionType):
        return _union_check(arguments)
    if origin is list:
        item_check = _check_of(arguments[0])
        return lambda value: value is None or (isinstance(value, list) and all(map(item_check, value)))
    if origin is dict:
        item_check = _check_of(arguments[1])
        return lambda value: value is None or (isinstance(value, dict) and all(map(item_check, value.values())))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = {member.value for member in hint}
        return lambda value: isinstance(value, str) and value in allowed
    if is_dataclass(hint) and hasattr(hint, "from_dict"):
        return _dataclass_check(hint)
    return lambda value: False


def _union_check(arguments: tuple) -> Callable[[Any], bool]:
    """`_find_union_arg`'s choice, in its order: a Variable alternative takes a reference, None takes None, and any
    other value goes to the first other alternative; None may also become an empty list or dict."""
    if len(arguments) == 2 and type(None) in arguments:  # Optional[T]: `_unwrap_optional`
        inner = _check_of(arguments[0] if arguments[1] is type(None) else arguments[1])
        return lambda value: value is None or inner(value)
    empty_allowed = any(typing.get_origin(argument) in (list, dict) for argument in arguments)
    # (is a Variable alternative, is None, the check of any other alternative)
    choices = [(_is_variable(argument), argument is type(None), None if _is_variable(argument) or
                argument is type(None) else _check_of(argument)) for argument in arguments]

    def check(value: Any) -> bool:
        for variable, none, other in choices:
            if variable:
                if _is_reference(value):
                    return True
            elif none:
                if value is None:
                    return True
            elif value is not None:
                return other(value)
        return value is None and empty_allowed

    return check


def _dataclass_check(cls: type) -> Callable[[Any], bool]:
    """Made when first called: the typed classes refer to each other (a for-each task holds a task)."""
    field_checks: dict[str, Callable[[Any], bool]] = {}
    required: set[str] = set()

    def check(value: Any) -> bool:
        if not field_checks:
            hints = typing.get_type_hints(cls)
            field_checks.update((field.name, _check_of(hints[field.name])) for field in fields(cls))
            required.update(field.name for field in fields(cls)
                            if field.default is MISSING and field.default_factory is MISSING)
        if not isinstance(value, dict) or "cls" in value or not required <= value.keys():
            return False
        for key, item in value.items():
            field_check = field_checks.get(key)
            if field_check is None or not field_check(item):
                return False
        return True

    return check
