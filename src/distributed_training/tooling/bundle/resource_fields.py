"""Fields of resources other than a job's tasks that the Databricks CLI requires, or refuses, once variables are
resolved; each one stops `databricks bundle validate` with an error.

- A dashboard needs `display_name` and `warehouse_id` (bundle/config/validate/required.go, errorForMissingFields);
  a SQL warehouse a `name` that is not blank (the same function).
- A grant needs a `principal` and at least one privilege, on any resource that has grants (required.go,
  errorForInvalidGrants).
- A dashboard or a Genie space may not carry an `etag` (validate/validate_dashboard_etags.go,
  validate_genie_space_etags.go); a job or a pipeline may not set `deployment.deployment_id` or `version_id`
  (validate/validate_deployment_fields.go): the CLI manages them.
- A Genie space takes its content from `file_path` or `serialized_space`, not both, and `serialized_space` is text, a
  mapping or a list (mutator/resourcemutator/configure_genie_space_serialized_space.go).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ...findings import Finding
from .jobs_and_clusters import as_list, as_mapping
from .paths import format_path


def resource_field_findings(tree: Mapping) -> list[Finding]:
    """The findings above for a target's tree, its references resolved."""
    resources = as_mapping(tree.get("resources"))
    findings = list(_required(resources))
    findings += _grants(resources)
    findings += _managed_by_the_cli(resources)
    findings += _genie_space_content(resources)
    return findings


def _of_type(resources: Mapping, kind: str) -> Iterator[tuple[str, Mapping]]:
    for key, resource in as_mapping(resources.get(kind)).items():
        if isinstance(resource, dict):
            yield str(key), resource


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _required(resources: Mapping) -> Iterator[Finding]:
    # (type, field, the CLI's words, whether a blank name counts as none: only the warehouse's, which the API trims)
    for kind, field, what, trimmed in (("dashboards", "display_name", "dashboard display_name", False),
                                       ("dashboards", "warehouse_id", "dashboard warehouse_id", False),
                                       ("sql_warehouses", "name", "sql_warehouse name", True)):
        for key, resource in _of_type(resources, kind):
            value = resource.get(field)
            if value in (None, "") or (trimmed and _blank(value)):
                yield Finding("required-resource-field", f"{kind[:-1]} {key!r} has no {field}: the CLI stops "
                              f"(\"{what} is required\")", f"set resources.{kind}.{key}.{field}",
                              path=format_path(("resources", kind, key)))


def _grants(resources: Mapping) -> Iterator[Finding]:
    for kind in resources:
        for key, resource in _of_type(resources, kind):
            for index, grant in enumerate(as_list(resource.get("grants"))):
                grant = as_mapping(grant)
                where = format_path(("resources", kind, key, "grants", index))
                if _blank(grant.get("principal")):
                    yield Finding("grant-incomplete", f"grant {index} of {kind[:-1]} {key!r} names no principal: the "
                                  "CLI stops (\"grant principal is required\")", "set its principal (a user, group "
                                  "or service principal)", path=where)
                if not as_list(grant.get("privileges")) and not isinstance(grant.get("privileges"), str):
                    yield Finding("grant-incomplete", f"grant {index} of {kind[:-1]} {key!r} lists no privilege: the "
                                  "CLI stops (\"grant privileges is required\"), as the grant would never settle",
                                  "list its privileges, e.g. [USE_SCHEMA, READ_VOLUME], or remove the grant",
                                  path=where)


def _managed_by_the_cli(resources: Mapping) -> Iterator[Finding]:
    for kind in ("dashboards", "genie_spaces"):
        for key, resource in _of_type(resources, kind):
            if not _blank(resource.get("etag")):
                yield Finding("cli-managed-field", f"{kind[:-1].replace('_', ' ')} {key!r} sets an etag, which only "
                              "the CLI may set: it stops (\"Etags must not be set in bundle configuration\")",
                              "remove the etag", path=format_path(("resources", kind, key, "etag")))
    for kind in ("jobs", "pipelines"):
        for key, resource in _of_type(resources, kind):
            for field in ("deployment_id", "version_id"):
                if not _blank(as_mapping(resource.get("deployment")).get(field)):
                    yield Finding("cli-managed-field", f"{kind[:-1]} {key!r} sets deployment.{field}, which the CLI "
                                  "sets on every deploy: it stops (\"must not be set in bundle configuration\")",
                                  f"remove deployment.{field}",
                                  path=format_path(("resources", kind, key, "deployment", field)))


def _genie_space_content(resources: Mapping) -> Iterator[Finding]:
    for key, space in _of_type(resources, "genie_spaces"):
        content = space.get("serialized_space")
        where = format_path(("resources", "genie_spaces", key, "serialized_space"))
        if isinstance(space.get("file_path"), str) and content is not None:
            yield Finding("genie-space-content", f"genie space {key!r} sets both file_path and serialized_space: the "
                          "CLI stops (\"specify only one\")", "keep one of them", path=where)
        elif isinstance(content, (bool, int, float)):
            yield Finding("genie-space-content", f"genie space {key!r} has serialized_space {content!r}: the CLI "
                          "stops (\"serialized_space must be a string, map, or sequence\")", "write the space as text "
                          "(its JSON), a mapping, or name its file with file_path", path=where)
