"""Every job against the fields and value kinds of the Databricks CLI's structs, with the CLI's severities.

The CLI reads each file by normalizing it against its structs (libs/dyn/convert/normalize.go): an unknown field, or a
value it cannot read as its field's kind (a mapping where a string goes, "two" for an integer), is a warning, and the
value is dropped. Once variables are resolved, a required field that is not set (bundle/config/validate/required.go)
and an enum field's unknown value (enum.go) are warnings too. `databricks bundle validate --strict` fails on them, as
`validate --strict` does. A whole `${...}` reference is taken anywhere (its value is known at deploy), and a null is
read as absent.

The fields and their kinds are those of the typed classes of `databricks-bundles` (the CLI's Python support, generated
from the same Jobs API spec), plus the fields the CLI's own structs add (`CLI_FIELDS`). A field unknown to
the installed package (it may be older than the CLI) is a warning, as an unknown field is for the CLI.

Walking every field of a large bundle's jobs costs most of `validate`'s time; a job that plainly parses
(`plainly_parses`: known fields, required ones there, values of the hinted kinds) has nothing to report and is spared.
"""

from __future__ import annotations

import difflib
import enum
import re
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from importlib.metadata import version as package_version
from typing import Any, Callable, Mapping

from ...findings import Finding
from .jobs_and_clusters import jobs_of
from .paths import Path, format_path

INSTALL_HINT = "pip install databricks-bundles"
# Fields of the CLI's structs that the typed classes lack, by typed class: bundle/config/resources/base.go
# (BaseResource: id, modified_status, url) and the Go SDK's jobs.JobSettings, which bundle/config/resources/job.go
# embeds (deployment, edit_mode, format), and its jobs.GitSource (git_snapshot, job_source): read-only or hidden in the
# bundle schema, known to the CLI's loader.
CLI_FIELDS = {"Job": ("id", "modified_status", "url", "deployment", "edit_mode", "format"),
              "GitSource": ("git_snapshot", "job_source")}
# Strings the CLI reads as a boolean (normalize.go, normalizeBool, after go-yaml's YAML 1.1 words).
BOOLEAN_WORDS = frozenset("true y Y yes Yes YES on On ON false n N no No NO off Off OFF".split())
INTEGER = re.compile(r"[+-]?\d+")  # what Go's strconv.ParseInt(s, 10, 64) reads
KIND_NAMES = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
              float: "a number"}


def typed_findings(tree: Mapping, parsed: dict[int, tuple[Any, list[Finding]]] | None = None) -> list[Finding]:
    """Warnings for every job of a target tree where the CLI's structs would warn (or one warning without the typed
    classes).

    `parsed`: the findings of jobs already read, by the id of their mapping, shared between the targets of one bundle:
    a job that a target does not override is the same mapping in every target. (Each entry keeps its mapping alive,
    so an id is never reused.)"""
    try:
        from databricks.bundles.jobs import Job
    except ModuleNotFoundError:
        return [Finding("typed-classes-missing", "the databricks-bundles package is not installed: jobs were not "
                        "checked against the typed resource classes", f"{INSTALL_HINT} (or install the validate "
                        "extra)", severity="warning")]
    parsed = {} if parsed is None else parsed
    findings = []
    for key, job in jobs_of(tree):
        path = ("resources", "jobs", key)
        known = parsed.get(id(job))
        if known is None or known[0][0] != path:
            found: list[Finding] = []
            if not plainly_parses(Job, job):
                _diagnose_fields(Job, job, path, found)
            known = parsed[id(job)] = ((path, job), found)
        findings += known[1]
    return findings


def _diagnose(hint: Any, value: Any, path: Path, found: list[Finding]) -> None:
    """Append a warning for each place in `value` that the CLI would warn about, read as `hint`."""
    if value is None or _is_reference(value):
        return
    kind = _base(hint)
    origin = typing.get_origin(kind)
    if is_dataclass(kind):
        if isinstance(value, dict):
            _diagnose_fields(kind, value, path, found)
        else:
            found.append(_wrong_type(_kind_mismatch(value, dict), dict, path))
    elif origin in (list, dict):
        if not isinstance(value, origin):
            found.append(_wrong_type(_kind_mismatch(value, origin), origin, path))
            return
        item_hint = typing.get_args(kind)[-1]
        items = enumerate(value) if origin is list else value.items()
        for part, item in items:
            _diagnose(item_hint, item, (*path, part if origin is list else str(part)), found)
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        _diagnose_enum(kind, value, path, found)
    elif kind in (str, bool, int, float):
        problem = _scalar_problem(kind, value)
        if problem:
            found.append(_wrong_type(problem, kind, path))


def _diagnose_fields(cls: type, value: dict, path: Path, found: list[Finding]) -> None:
    hints = typing.get_type_hints(cls)
    known = {field.name for field in fields(cls)}
    extra = CLI_FIELDS.get(cls.__name__, ())
    for key, item in value.items():
        if key in known:
            _diagnose(hints[key], item, (*path, key), found)
        elif key not in extra:
            found.append(_unknown_field(cls, str(key), sorted(known | set(extra)), path))
    for field in fields(cls):
        if field.default is MISSING and field.default_factory is MISSING and value.get(field.name) is None:
            found.append(Finding("required-field", f"required field {field.name!r} of {_label(cls)} is not set: "
                                 "the CLI warns (\"required field is not set\") and the Jobs API refuses the job",
                                 f"set {field.name}", path=format_path(path), severity="warning"))


def _diagnose_enum(cls: type[enum.Enum], value: Any, path: Path, found: list[Finding]) -> None:
    if isinstance(value, (dict, list)):
        found.append(_wrong_type(_kind_mismatch(value, str), str, path))
        return
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)  # normalizeString
    allowed = [member.value for member in cls]
    if text in allowed or "${" in text:  # enum.go leaves a value that holds a reference to the deploy
        return
    close = difflib.get_close_matches(text, allowed, n=1)
    field = next(part for part in reversed(path) if isinstance(part, str))
    found.append(Finding("invalid-enum", f"{text!r} is not a valid {field}: the CLI warns (\"invalid value for enum "
                         "field\") and the Jobs API refuses it", f"{f'did you mean {close[0]}? ' if close else ''}use "
                         f"one of {', '.join(allowed)}", path=format_path(path), severity="warning"))


def _scalar_problem(kind: type, value: Any) -> str | None:
    """Why the CLI cannot read `value` as `kind` (normalize.go: normalizeString, -Bool, -Int, -Float), or None."""
    if isinstance(value, (dict, list)):
        return _kind_mismatch(value, kind)
    if kind is str:
        return None
    if kind is bool:
        return None if isinstance(value, bool) or value in BOOLEAN_WORDS else \
            f"{value!r} is not a boolean (true or false)"
    if isinstance(value, bool):
        return f"{value!r} is a boolean, not {KIND_NAMES[kind]}"
    if kind is int:
        if isinstance(value, float) and value != int(value):
            return f"{value!r} is not a whole number"
        return None if isinstance(value, (int, float)) or INTEGER.fullmatch(value) else \
            f"cannot read {value!r} as an integer"
    try:
        float(value)
        return None
    except ValueError:
        return f"cannot read {value!r} as a number"


def _base(hint: Any) -> Any:
    """The kind of a field's type hint without its `${...}` and None alternatives: `VariableOrOptional[int]` -> int."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kinds = [argument for argument in typing.get_args(hint)
                 if argument is not type(None) and not _is_variable(argument)]
        return kinds[0] if kinds else Any
    return hint


def _kind_mismatch(value: Any, expected: type) -> str:
    return f"{KIND_NAMES.get(type(value), type(value).__name__)} where {KIND_NAMES[expected]} goes"


def _wrong_type(problem: str, expected: type, path: Path) -> Finding:
    return Finding("wrong-type", f"{problem}: the CLI drops the value with a warning", f"write {KIND_NAMES[expected]} "
                   "here", path=format_path(path), severity="warning")


def _unknown_field(cls: type, key: str, known: list[str], path: Path) -> Finding:
    close = difflib.get_close_matches(key, known, n=1)
    installed = package_version("databricks-bundles")
    return Finding("unknown-field", f"unknown field {key!r} for {_label(cls)}: the CLI ignores it (its warning "
                   f"\"unknown field: {key}\")", f"{f'did you mean {close[0]!r}? ' if close else ''}remove it or fix "
                   f"its name (if your Databricks CLI knows it, databricks-bundles {installed} is older: update it)",
                   path=format_path((*path, key)), severity="warning")


def _label(cls: type) -> str:
    """`JobEmailNotifications` -> `job email notifications`, as a message names the part of a job."""
    return re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()


def plainly_parses(hint: Any, value: Any) -> bool:
    """True where `from_dict` (databricks.bundles.core._transform) surely accepts `value` as `hint`, so that there is
    nothing to report; False where it may not, or where this does not follow its rules (then `_diagnose` reads the
    value). Never True for a value it refuses: each kind is as strict as `_transform` or stricter (an int field takes
    an int, not a numeric string), and `_transform` is no more lenient than the CLI (`_diagnose`)."""
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
