"""Bundle variables: the value each one takes in a target, and the variables that have none.

The CLI's order (bundle/config/mutator/set_variables.go): the declaration's own `value:`, then `--var name=value` /
the BUNDLE_VAR_<name> environment variable, then a `lookup` (resolved against the workspace at deploy time: known, but
its value is not), then the target's file `.databricks/bundle/<target>/variable-overrides.json`, then the default (the
target's, else the root's). A variable with none of these makes the CLI stop ("no value assigned to required
variable").
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Any, Mapping

from ...findings import Finding
from .paths import format_path
from .sourced_trees import file_at
from .yaml_files import MAX_FILE_BYTES, special_file_kind

ENV_PREFIX = "BUNDLE_VAR_"
OVERRIDES_FILE = ".databricks/bundle/{target}/variable-overrides.json"


@dataclass(frozen=True)
class Variable:
    name: str
    value: Any = None
    has_value: bool = False  # a default, a target value or BUNDLE_VAR_<name>
    is_lookup: bool = False  # resolved by the CLI against the workspace, at deploy time


def target_variables(tree: Mapping, environ: Mapping[str, str] | None = None,
                     overrides: Mapping[str, Any] | None = None) -> dict[str, Variable]:
    """Every variable of a target tree (see `Bundle.target_tree`) with what it resolves to. `overrides`: the target's
    variable-overrides.json (see `read_overrides`)."""
    environ = os.environ if environ is None else environ
    overrides = overrides or {}
    variables = tree.get("variables")
    if not isinstance(variables, dict):
        return {}
    resolved = {}
    for name, definition in variables.items():
        name = str(name)
        if definition is not None and not isinstance(definition, dict):
            continue  # the CLI's loader drops it with a warning: the variable is not declared
        definition = definition or {}
        if definition.get("value") is not None:
            resolved[name] = Variable(name, definition["value"], has_value=True)
        elif ENV_PREFIX + name in environ:
            resolved[name] = Variable(name, environ[ENV_PREFIX + name], has_value=True)
        elif definition.get("lookup") is not None:
            resolved[name] = Variable(name, is_lookup=True)
        elif overrides.get(name) is not None:
            resolved[name] = Variable(name, overrides[name], has_value=True)
        else:
            resolved[name] = Variable(name, definition.get("default"), has_value=definition.get("default") is not None)
    return resolved


def read_overrides(bundle_root: FilePath, target: str) -> tuple[dict[str, Any], list[Finding]]:
    """The target's variable values from `.databricks/bundle/<target>/variable-overrides.json`, which the CLI reads
    before defaults; a file it cannot read is an error, as for the CLI (set_variables.go, readVariablesFromFile)."""
    name = OVERRIDES_FILE.format(target=target)
    try:
        info = os.stat(bundle_root / name)
    except (OSError, ValueError):  # absent: the usual case
        return {}, []
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:  # a FIFO's read would block forever
        why = (f"it is {special_file_kind(info.st_mode)[0]}, not a regular file" if not stat.S_ISREG(info.st_mode)
               else f"it is {info.st_size:,} bytes, over {MAX_FILE_BYTES:,}")
        return {}, [_overrides_unreadable(name, why)]
    try:
        text = (bundle_root / name).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return {}, []
    try:
        values = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        why = f"it is not JSON ({str(error).splitlines()[0][:120]})"
    else:
        if isinstance(values, dict):
            return values, []
        why = f"it holds a {type(values).__name__}, not an object"
    return {}, [_overrides_unreadable(name, why)]


def _overrides_unreadable(name: str, why: str) -> Finding:
    return Finding("variable-overrides-unreadable", f"cannot read {name}: {why}, and the CLI stops there",
                   'write it as a JSON object of variable names to values: {"catalog": "main"}, or delete it',
                   file=name)


def missing_value_findings(variables: dict[str, Variable], target: str) -> list[Finding]:
    return [Finding("variable-without-value",
                    f"variable {variable.name!r} has no value, default or lookup, and target {target!r} gives it none: "
                    "the CLI stops (\"no value assigned to required variable\")",
                    f"give it a default, set targets.{target}.variables.{variable.name}, or pass "
                    f"--var {variable.name}=... (or BUNDLE_VAR_{variable.name}) to the CLI",
                    path=format_path(("variables", variable.name)))
            for variable in variables.values() if not variable.has_value and not variable.is_lookup]


def undeclared_target_variable_findings(root_tree: Mapping, target: str) -> list[Finding]:
    """Variables target `target` assigns that the root never declares: the CLI stops ("variable X is not defined but
    is assigned a value", bundle/config/root.go, validateVariableOverrides), for the target it deploys."""
    declared = root_tree.get("variables") if isinstance(root_tree.get("variables"), dict) else {}
    section = root_tree.get("targets", {}).get(target) if isinstance(root_tree.get("targets"), dict) else None
    assigned = section.get("variables") if isinstance(section, dict) else None
    return [Finding("undeclared-target-variable",
                    f"target {target!r} assigns variable {name!r}, which the bundle does not declare: the CLI stops "
                    "(\"variable is not defined but is assigned a value\")",
                    f"declare {name!r} under the top-level variables mapping (with a description and a default), or "
                    "fix the name", file=file_at(root_tree, ("targets", target, "variables", name)),
                    path=format_path(("targets", target, "variables", name)))
            for name in (assigned if isinstance(assigned, dict) else ()) if name not in declared]
