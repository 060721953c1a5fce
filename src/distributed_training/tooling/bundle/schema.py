"""Check bundle configuration against the CLI's JSON schema (`databricks bundle schema`).

The schema is read with Draft 2020-12. Its `pattern`s are Go (RE2) regular expressions using `\\p{L}`, which
Python's `re` cannot compile, so `pattern` is checked with the `regex` package instead. Nearly every field is a
`oneOf` (the value itself, or a `${var...}` reference), so the raw error is usually "is not valid under any of
the given schemas" about a whole `resources` mapping; `schema_findings` walks down to the errors that say what
is actually wrong, and where.

The schema is stricter than the CLI: its loader reads `"2"` as 2, an empty `targets.dev:` or `run_as:` as absent, and
only warns about an unknown field, a missing required field, a wrong kind or an unknown enum value, dropping the value
(libs/dyn/convert/normalize.go, bundle/config/validate/required.go and enum.go). So every schema finding is a warning,
as `databricks bundle validate` would print it, and `validate --strict` fails on it as `bundle validate --strict` does.
What the CLI itself refuses is found by the other checks.
"""

from __future__ import annotations

import difflib
import json
import re
import stat
from pathlib import Path as FilePath
from typing import Any

from ...findings import Finding
from .paths import format_path

SCHEMA_ENV = "DATABRICKS_BUNDLE_SCHEMA"
_REFERENCE_PATTERN_ROOT = re.compile(r"^\\\$\\\{\((\w+)")
_TYPE_NAMES = {"integer": "an integer", "number": "a number", "boolean": "a boolean (true or false)",
               "string": "a string", "object": "a mapping", "array": "a list", "null": "nothing"}


class SchemaUnavailable(ValueError):
    """The schema file cannot be used (missing, not JSON), or the packages to check it are not installed."""


def load_validator(schema_path: str | FilePath):
    """A jsonschema validator for the schema at `schema_path`, with RE2-style `pattern` support."""
    try:
        import jsonschema
        import regex
    except ModuleNotFoundError as error:
        raise SchemaUnavailable(f"checking against a schema needs the {error.name!r} package: "
                                "pip install jsonschema regex") from error
    schema = _read_schema(FilePath(schema_path))
    validator_class = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                                   {"pattern": _re2_pattern(jsonschema, regex)})
    # Against the meta-schema, without its format checks: `format: regex` would compile the RE2 patterns with `re`.
    meta = jsonschema.Draft202012Validator(jsonschema.Draft202012Validator.META_SCHEMA)
    try:
        error = jsonschema.exceptions.best_match(meta.iter_errors(schema))
    except RecursionError:
        error = "nested too deeply"
    if error is not None:
        raise SchemaUnavailable(f"{schema_path} is not a valid JSON schema ({_first_line(error)}); {PRODUCE_HINT}")
    return validator_class(schema)


PRODUCE_HINT = "produce the bundle schema with `databricks bundle schema > schema.json`"
MAX_SCHEMA_BYTES = 64 * 1024 * 1024  # the CLI's schema is about 1 MB


def _read_schema(path: FilePath) -> dict:
    """The parsed schema file; a `SchemaUnavailable` (a usage error) for anything that is not the bundle schema.
    Only a regular file is opened (a FIFO would block), of bounded size."""
    try:
        info = path.stat()
    except OSError as error:
        raise SchemaUnavailable(f"cannot read the bundle schema {path}: {error.strerror or error}; "
                                f"{PRODUCE_HINT}") from None
    if not stat.S_ISREG(info.st_mode):
        raise SchemaUnavailable(f"cannot read the bundle schema {path}: it is not a regular file; "
                                f"pass a JSON file: {PRODUCE_HINT}")
    if info.st_size > MAX_SCHEMA_BYTES:
        raise SchemaUnavailable(f"the bundle schema {path} is {info.st_size:,} bytes, over {MAX_SCHEMA_BYTES:,}: "
                                f"not the CLI's schema; {PRODUCE_HINT}")
    try:
        schema = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise SchemaUnavailable(f"cannot read the bundle schema {path}: {_first_line(error)}; {PRODUCE_HINT}") \
            from None
    if not isinstance(schema, dict):
        raise SchemaUnavailable(f"{path} is not a JSON schema (it holds a {type(schema).__name__}); {PRODUCE_HINT}")
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not {"bundle", "resources"} <= set(properties):
        raise SchemaUnavailable(f"{path} is not the bundle's JSON schema (it describes no bundle and resources "
                                f"properties); {PRODUCE_HINT}")
    return schema


def _first_line(error: BaseException | str) -> str:
    text = "nested too deeply" if isinstance(error, RecursionError) else str(error) or type(error).__name__
    return text.splitlines()[0][:200]


def _re2_pattern(jsonschema, regex):
    """`pattern` checked with the `regex` package, which reads the schema's RE2 `\\p{L}` classes."""
    def re2_pattern(validator, pattern, instance, _schema):
        if validator.is_type(instance, "string") and not regex.search(pattern, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")

    return re2_pattern


def schema_findings(validator, instance: Any, file: str | None = None) -> list[Finding]:
    """One finding per real problem in `instance` (the deepest relevant errors, not the `oneOf` wrapper)."""
    findings: list[Finding] = []
    for error in validator.iter_errors(instance):
        for leaf in _relevant_errors(error):
            for finding in _to_findings(leaf, file):
                if finding not in findings:
                    findings.append(finding)
    return findings


def _relevant_errors(error) -> list:
    if error.validator not in ("oneOf", "anyOf") or not error.context:
        return [error]
    branches: dict[int, list] = {}
    for sub_error in error.context:
        branches.setdefault(sub_error.relative_schema_path[0], []).append(sub_error)
    here = list(error.absolute_path)
    # A branch whose type does not even fit the value (a mapping against the `${var...}` string branch) says
    # nothing about what is wrong with it.
    fitting = [errors for errors in branches.values()
               if not any(e.validator == "type" and list(e.absolute_path) == here for e in errors)]
    if not fitting or all(list(e.absolute_path) == here and e.validator in ("enum", "const", "pattern", "type")
                          for errors in fitting for e in errors):
        return [error]  # nothing deeper: `_to_findings` lists what the value may be
    deepest = max(fitting, key=lambda errors: (max(len(e.absolute_path) for e in errors), -len(errors)))
    return [leaf for sub_error in deepest for leaf in _relevant_errors(sub_error)]


def _to_findings(error, file: str | None) -> list[Finding]:
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = list((error.schema.get("properties") or {}))
        return [_schema_warning(f"unknown field {key!r}", _unknown_field_fix(key, known), file=file,
                                path=format_path((*path, key)))
                for key in error.instance if key not in known]
    if error.validator == "required":
        missing = error.message.split("'")[1] if error.message.count("'") >= 2 else error.message
        return [_schema_warning(f"required field {missing!r} is missing", f"add {missing}", file=file,
                                path=format_path(path))]
    if error.validator in ("oneOf", "anyOf"):
        expected = _expected(error.validator_value)
        return [_schema_warning(f"{_short(error.instance)} is not valid here: expected {expected}",
                                f"use {expected}", file=file, path=format_path(path))]
    if error.validator == "enum":
        choices = ", ".join(map(str, error.validator_value))
        return [_schema_warning(f"{_short(error.instance)} is not one of {choices}", f"use one of {choices}",
                                file=file, path=format_path(path))]
    if error.validator == "type":
        expected = _TYPE_NAMES.get(str(error.validator_value), str(error.validator_value))
        return [_schema_warning(f"{_short(error.instance)} is not {expected}", f"use {expected}", file=file,
                                path=format_path(path))]
    return [_schema_warning(error.message, "make the value match the bundle schema (`databricks bundle schema`)",
                            file=file, path=format_path(path))]


def _schema_warning(message: str, fix: str, file: str | None, path: str) -> Finding:
    return Finding("schema", message, fix, file=file, path=path, severity="warning")


def _expected(alternatives: list[dict]) -> str:
    described: list[str] = []
    roots: list[str] = []
    for alternative in alternatives:
        root = _REFERENCE_PATTERN_ROOT.match(alternative.get("pattern", ""))
        if root:
            roots.append(root.group(1))
        elif "enum" in alternative:
            described.append("one of " + ", ".join(map(str, alternative["enum"])))
        elif "const" in alternative:
            described.append(repr(alternative["const"]))
        elif "type" in alternative:
            described.append(_TYPE_NAMES.get(str(alternative["type"]), str(alternative["type"])))
    if roots:
        described.append("a reference such as " + ", ".join("${" + root + ".…}" for root in roots))
    return " or ".join(described) or "a value the schema accepts"


def _unknown_field_fix(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}remove it or fix its name: the CLI ignores unknown fields (and fails with --strict)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
