"""The fields of the Databricks CLI's configuration structs that the schema does not settle for `validate`.

- `ROOT_FIELDS`: the top-level keys of a bundle file (`bundle/config/root.go`, struct `Root`). The CLI reads a file
  by normalizing it against that struct (`libs/dyn/convert/normalize.go`): any other key is dropped with the warning
  "unknown field: <key>", unless its value is an anchor or a collection made only of anchors (a block kept for
  aliases). The bundle JSON schema allows any top-level key, so only this rule sees them.
- `TARGET_FIELDS`: the keys of a target (`bundle/config/target.go`, struct `Target`), under the same rule.
- `REFERABLE`: what `${bundle.…}` and `${workspace.…}` may name. The CLI resolves a reference against the
  configuration normalized with every field of the structs present (`bundle/config/mutator/
  resolve_variable_references.go`, `convert.IncludeMissingFields`), so a field that is not set resolves (to its
  empty value, or to what the CLI fills in), and a field that no struct has is "reference does not exist"
  (`libs/dyn/dynvar/resolve.go`). From `bundle/config/bundle.go` (Bundle, Terraform), `git.go`, `deployment.go`,
  `lock.go` and `workspace.go` (Workspace, User: the SCIM user of `databricks-sdk-go` `iam.User`).
"""

from __future__ import annotations

from typing import Any

ROOT_FIELDS = ("variables", "bundle", "include", "workspace", "artifacts", "resources", "targets", "environments",
               "sync", "run_as", "presets", "experimental", "permissions", "scripts", "python",
               "__locations", "definitions")  # the last two are internal to the CLI but known to its struct

TARGET_FIELDS = ("default", "mode", "presets", "compute_id", "cluster_id", "bundle", "workspace", "artifacts",
                 "resources", "variables", "git", "run_as", "sync", "permissions")

# A leaf is None; ANY: the field holds data of its own (lists, maps), any path below it exists or not at run time.
ANY: dict[str, Any] = {}
_GIT = {"branch": None, "origin_url": None, "commit": None, "bundle_root_path": None, "actual_branch": None}
_USER = {"short_name": None, "domain_friendly_name": None, "userName": None, "displayName": None, "id": None,
         "active": None, "externalId": None, "emails": ANY, "entitlements": ANY, "groups": ANY, "name": ANY,
         "roles": ANY, "schemas": ANY}
REFERABLE: dict[str, Any] = {
    "bundle": {"name": None, "target": None, "environment": None, "terraform": {"exec_path": None},
               "force": None, "git": _GIT, "mode": None, "compute_id": None, "cluster_id": None, "engine": None,
               "deployment": {"fail_on_active_runs": None, "lock": {"enabled": None, "force": None}},
               "databricks_cli_version": None, "uuid": None},
    "workspace": {"host": None, "profile": None, "auth_type": None, "metadata_service_url": None,
                  "client_id": None, "google_service_account": None, "azure_workspace_resource_id": None,
                  "azure_use_msi": None, "azure_client_id": None, "azure_tenant_id": None,
                  "azure_environment": None, "azure_login_app_id": None, "experimental_is_unified_host": None,
                  "account_id": None, "workspace_id": None, "current_user": _USER, "root_path": None,
                  "file_path": None, "resource_path": None, "artifact_path": None, "state_path": None,
                  "snapshot_path": None},
}


def unknown_field(path: tuple) -> tuple[int, list[str]] | None:
    """For a reference path under `bundle` or `workspace`: None when the CLI's structs have it, else the position
    of the first part they lack and the names known there."""
    fields: Any = REFERABLE
    for index, part in enumerate(path):
        if fields is ANY:
            return None
        if fields is None or isinstance(part, int) or part not in fields:
            return index, sorted(fields or ())
        fields = fields[part]
    return None
