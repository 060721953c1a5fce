"""The `scripts` block (commands `databricks bundle run <key>` runs), as the Databricks CLI checks it; each finding
stops `databricks bundle validate` with an error.

- A script's key may not be a resource's key too: `bundle run <key>` would not know which to run
  (bundle/config/validate/unique_resource_keys.go: "multiple resources or scripts have been defined with the same
  key").
- A script needs `content`, with no `${...}` in it (the shell would read it), and its `env` may reference only
  `${bundle.*}`, `${workspace.*}` and `${var.*}` (`${variables.*}`), the values known before it runs
  (bundle/config/validate/scripts.go).
"""

from __future__ import annotations

from typing import Mapping

from ...findings import Finding
from .jobs_and_clusters import as_mapping
from .paths import format_path
from .references import references_in

ENV_REFERENCE_ROOTS = ("bundle", "workspace", "var", "variables")


def script_findings(root_tree: Mapping) -> list[Finding]:
    """The findings above for the bundle's merged files (scripts are not set per target)."""
    resource_keys = {str(key): str(kind) for kind, of_kind in as_mapping(root_tree.get("resources")).items()
                     for key in as_mapping(of_kind)}
    findings = []
    for key, script in as_mapping(root_tree.get("scripts")).items():
        key, script = str(key), as_mapping(script)
        if key in resource_keys:
            findings.append(Finding("script-key-taken", f"script {key!r} has the key of {resource_keys[key]} "
                                    f"{key!r}: the CLI stops (\"multiple resources or scripts have been defined with "
                                    "the same key\")", "rename the script (or the resource): keys are unique across "
                                    "resources and scripts", path=format_path(("scripts", key))))
        findings += _content(key, script.get("content"))
        for name, value in as_mapping(script.get("env")).items():
            findings += _env(key, str(name), value)
    return findings


def _content(key: str, content: object) -> list[Finding]:
    where = format_path(("scripts", key, "content"))
    if not isinstance(content, str) or not content:
        return [Finding("script-content", f"script {key!r} has no content: the CLI stops", "set scripts."
                        f"{key}.content to the command to run", path=where)]
    reference = next((reference for reference in references_in(content) if reference.path is not None), None)
    if reference is None:
        return []
    return [Finding("script-content", f"script {key!r} holds {reference.text} in its content: the CLI stops (the "
                    "shell, not the CLI, would read ${...} there)", f"declare it in the script's env (env: {{MY_VALUE: "
                    f"{reference.text}}}) and use $MY_VALUE in content", path=where)]


def _env(key: str, name: str, value: object) -> list[Finding]:
    if not isinstance(value, str):
        return []
    return [Finding("script-env-reference", f"script {key!r} sets env {name} from {reference.text}, which is not "
                    "known before scripts run: the CLI stops", "use only ${bundle.*}, ${workspace.*} or ${var.*} in "
                    "a script's env", path=format_path(("scripts", key, "env", name)))
            for reference in references_in(value)
            if reference.path is not None and reference.path[0] not in ENV_REFERENCE_ROOTS]
