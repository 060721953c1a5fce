"""`run_as`: the identity a bundle's jobs and pipelines run as, as the Databricks CLI checks it
(bundle/config/mutator/resourcemutator/run_as.go, validateRunAs).

- `run_as:` left empty is as if absent (acceptance/bundle/run_as/empty_run_as passes); a `run_as` mapping must name
  exactly one identity: neither `user_name` nor `service_principal_name` (empty_run_as_dict, empty_sp), or both
  (invalid_both_sp_and_user), and the CLI stops.
- Running as an identity other than the deployer's is refused for model serving endpoints, quality monitors, apps and
  dashboards with `embed_credentials: true` (model_serving_different, dashboard_embed). Who deploys is unknown
  offline (a CI service principal often deploys as itself), so that is a warning naming the condition, unless the
  identity is `${workspace.current_user.userName}`, the deployer by definition.
"""

from __future__ import annotations

from typing import Mapping

from ...findings import Finding
from .jobs_and_clusters import as_mapping

IDENTITIES = ("user_name", "service_principal_name")
DEPLOYER = "${workspace.current_user.userName}"
# resource type -> how the CLI's message names the resources that cannot run as another identity
RUN_AS_REFUSED = {"model_serving_endpoints": "model serving endpoints", "quality_monitors": "quality monitors",
                  "apps": "apps"}


def run_as_findings(tree: Mapping) -> list[Finding]:
    """The CLI's run_as rules on a target's tree, its references resolved."""
    run_as = tree.get("run_as")
    if not isinstance(run_as, dict):
        return []  # absent, left empty, or of another kind (the typed and schema checks' finding)
    named = {field: run_as.get(field) for field in IDENTITIES if run_as.get(field) not in (None, "")}
    if len(named) != 1:
        what = "names neither user_name nor service_principal_name" if not named else "names both a user and a " \
            "service principal"
        return [Finding("run-as-identity", f"run_as {what}: the CLI stops (\"run_as section must specify exactly one "
                        "identity\")", "set exactly one of run_as.user_name and run_as.service_principal_name (or "
                        "remove run_as to run as whoever deploys)", path="run_as")]
    [identity] = named.values()
    if identity == DEPLOYER:
        return []
    return [Finding("run-as-unsupported", f"{what} cannot run as another identity than the deployer's, and run_as "
                    f"names {identity!r}: the CLI refuses the bundle unless {identity!r} deploys it",
                    f"deploy as {identity!r} (its own CI token), move these resources to a bundle without run_as, or "
                    "remove run_as", path=path, severity="warning")
            for path, what in _refused(tree)]


def _refused(tree: Mapping) -> list[tuple[str, str]]:
    """(path, what) of every resource the CLI refuses to run as an identity other than the deployer's."""
    resources = as_mapping(tree.get("resources"))
    refused = [(f"resources.{kind}", what) for kind, what in RUN_AS_REFUSED.items() if as_mapping(resources.get(kind))]
    refused += [(f"resources.dashboards.{key}", "a dashboard with embed_credentials: true")
                for key, dashboard in as_mapping(resources.get("dashboards")).items()
                if as_mapping(dashboard).get("embed_credentials") is True]
    return refused
