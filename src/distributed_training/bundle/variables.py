"""Bundle variables: the value each one takes in a target, and the variables that have none.

The CLI's order: `--var name=value` / the BUNDLE_VAR_<name> environment variable, then the target's value,
then the root default. A `lookup` variable is resolved by the CLI against the workspace at deploy time: it is
known, but its value is not. A variable with none of these makes `databricks bundle deploy` fail.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..findings import Finding
from .paths import format_path

ENV_PREFIX = "BUNDLE_VAR_"


@dataclass(frozen=True)
class Variable:
    name: str
    value: Any = None
    has_value: bool = False  # a default, a target value or BUNDLE_VAR_<name>
    is_lookup: bool = False  # resolved by the CLI against the workspace, at deploy time


def target_variables(tree: Mapping, environ: Mapping[str, str] | None = None) -> dict[str, Variable]:
    """Every variable of a target tree (see `Bundle.target_tree`) with what it resolves to."""
    environ = os.environ if environ is None else environ
    variables = tree.get("variables")
    if not isinstance(variables, dict):
        return {}
    resolved = {}
    for name, definition in variables.items():
        name = str(name)
        if ENV_PREFIX + name in environ:
            resolved[name] = Variable(name, environ[ENV_PREFIX + name], has_value=True)
        elif not isinstance(definition, dict):
            resolved[name] = Variable(name, definition, has_value=definition is not None)
        elif "lookup" in definition:
            resolved[name] = Variable(name, is_lookup=True)
        else:
            resolved[name] = Variable(name, definition.get("default"), has_value=definition.get("default") is not None)
    return resolved


def missing_value_findings(variables: dict[str, Variable], target: str) -> list[Finding]:
    return [Finding("variable-without-value",
                    f"variable {variable.name!r} has no default and target {target!r} gives it no value",
                    f"give it a default, set targets.{target}.variables.{variable.name}, or pass "
                    f"--var {variable.name}=... (or BUNDLE_VAR_{variable.name}) to the CLI",
                    path=format_path(("variables", variable.name)))
            for variable in variables.values() if not variable.has_value and not variable.is_lookup]


def undeclared_target_variable_findings(root_tree: Mapping) -> list[Finding]:
    """Variables a target assigns that the root never declares: a warning (the CLI's own fixtures accept them)."""
    declared = root_tree.get("variables") if isinstance(root_tree.get("variables"), dict) else {}
    targets = root_tree.get("targets") if isinstance(root_tree.get("targets"), dict) else {}
    findings = []
    for target_name, target in targets.items():
        assigned = target.get("variables") if isinstance(target, dict) else None
        for name in assigned if isinstance(assigned, dict) else ():
            if name not in declared:
                findings.append(Finding(
                    "undeclared-target-variable",
                    f"target {target_name!r} assigns variable {name!r}, which the bundle does not declare",
                    f"declare {name!r} under the top-level variables mapping (with a description and a default)",
                    path=format_path(("targets", target_name, "variables", name)), severity="warning"))
    return findings
