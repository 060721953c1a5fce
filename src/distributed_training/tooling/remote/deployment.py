"""Find the job `databricks bundle deploy` created for a resource key in a target.

First from the bundle's local deployment state, which the CLI keeps under `.databricks/bundle/<target>/`:
- the Terraform engine's `terraform/terraform.tfstate`: a `databricks_job` resource named after the key, whose
  instance's `attributes.id` is the job id;
- the direct engine's `resources.json`: `state["resources.jobs.<key>"]["__id__"]`.
When neither names the job (not deployed from this folder, or state kept only in the workspace), the Jobs API
is searched for the tags every generated job carries: `bundle: <bundle name>`, `job_key: <key>`,
`target: <target>`. In development mode every user who deploys gets a job with the same tags: several matches
are narrowed to the jobs the current user created before they are called ambiguous.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..bundle.loader import IMPLICIT_TARGET, load_bundle
from .retry_policy import Patience

STATE_FOLDER = Path(".databricks", "bundle")
TERRAFORM_STATE = Path("terraform", "terraform.tfstate")
DIRECT_STATE = Path("resources.json")
VARIABLE_REFERENCE = re.compile(r"\$\{var\.([A-Za-z0-9_-]+)\}")


class DeploymentError(ValueError):
    """The job cannot be found (or told apart): the message names what was looked for and the fix."""


@dataclass(frozen=True)
class BundleTarget:
    root: Path
    target: str
    name: str | None  # bundle.name with its ${var.*} references resolved; None when it cannot be
    raw_name: str
    profile: str | None  # the target's workspace.profile, if it names one
    job_keys: tuple[str, ...] = ()  # the keys under resources.jobs in this target


@dataclass(frozen=True)
class DeployedJob:
    job_id: int
    name: str
    found_in: str  # where the id came from: a state file, or the Jobs API's tags


def read_bundle_target(bundle_dir: str | Path, requested_target: str | None) -> BundleTarget:
    """The bundle in `bundle_dir` as deployed to `requested_target` (default: the bundle's default target).

    Raises `NotABundle` (no databricks.yml there) or `DeploymentError`.
    """
    from ..bundle.variables import target_variables

    bundle = load_bundle(bundle_dir)
    target = choose_target(bundle.target_names, _default_targets(bundle.tree), requested_target,
                           bundle.root_file.name)
    tree = bundle.target_tree(target)
    bundle_section = tree.get("bundle") if isinstance(tree.get("bundle"), dict) else {}
    raw_name = bundle_section.get("name")
    if not isinstance(raw_name, str) or not raw_name:
        errors = [finding for finding in bundle.findings if finding.is_error]
        why = f": {errors[0].message}" if errors else ""
        fix = errors[0].fix if errors else "add `bundle: {name: ...}`, the name the bundle was deployed with"
        raise DeploymentError(f"no bundle.name in {bundle.root / bundle.root_file.name}{why}; fix: {fix}")
    variables = target_variables(tree)

    def value_of(match: re.Match) -> str:
        variable = variables.get(match.group(1))
        return str(variable.value) if variable is not None and variable.has_value else match.group(0)

    name = VARIABLE_REFERENCE.sub(value_of, raw_name)
    workspace = tree.get("workspace") if isinstance(tree.get("workspace"), dict) else {}
    profile = workspace.get("profile")
    resources = tree.get("resources") if isinstance(tree.get("resources"), dict) else {}
    jobs = resources.get("jobs") if isinstance(resources.get("jobs"), dict) else {}
    return BundleTarget(bundle.root, target, None if "${" in name else name, raw_name,
                        profile if isinstance(profile, str) and "${" not in profile else None,
                        tuple(str(key) for key in jobs))


def check_job_key(bundle: BundleTarget, key: str) -> None:
    """Refuse a key that is not under resources.jobs of the bundle's target: read from the files, no network."""
    if key in bundle.job_keys:
        return
    where = f"resources.jobs of bundle {bundle.raw_name!r}, target {bundle.target!r}"
    if not bundle.job_keys:
        raise DeploymentError(f"job key {key!r} is not in {where}: the bundle declares no jobs; fix: run this "
                              "from the folder of the bundle that holds the job (or pass --bundle-dir)")
    close = difflib.get_close_matches(key, bundle.job_keys, n=3, cutoff=0.5)
    suggestion = f"did you mean {' or '.join(close)}? " if close else ""
    raise DeploymentError(f"job key {key!r} is not in {where} (its jobs: {', '.join(bundle.job_keys)}); "
                          f"fix: {suggestion}pass one of those keys")


def _default_targets(tree) -> list[str]:
    targets = tree.get("targets")
    if not isinstance(targets, dict):
        return []
    return [str(name) for name, body in targets.items() if isinstance(body, dict) and body.get("default") is True]


def choose_target(declared: list[str], defaults: list[str], requested: str | None, root_file: str) -> str:
    """The target the CLI would deploy: the requested one, else the default one, else the only one."""
    if requested is not None:
        if declared and requested not in declared:
            close = difflib.get_close_matches(requested, declared, n=1, cutoff=0.5)
            raise DeploymentError(f"target {requested!r} is not declared in {root_file} (targets: "
                                  f"{', '.join(declared)}); fix: pass --target {close[0] if close else declared[0]}"
                                  f"{'' if close else ' or another of them'}")
        if not declared and requested != IMPLICIT_TARGET:
            raise DeploymentError(f"target {requested!r} is not declared: {root_file} declares no targets; "
                                  "fix: leave out --target")
        return requested
    if not declared:
        return IMPLICIT_TARGET
    if defaults:
        return defaults[0]
    if len(declared) == 1:
        return declared[0]
    raise DeploymentError(f"{root_file} marks no target as default (targets: {', '.join(declared)}); fix: pass "
                          f"--target {declared[0]} or another of them")


def job_id_from_local_state(root: Path, target: str, key: str) -> tuple[int, Path] | None:
    """The job id that the local deployment state records for `key`, and the state file; None if none does.

    When both engines' files name the job (a bundle moved from one engine to the other), the newer file wins.
    """
    folder = root / STATE_FOLDER / target
    found = []
    readers = ((folder / TERRAFORM_STATE, _id_in_terraform_state), (folder / DIRECT_STATE, _id_in_direct_state))
    for path, read in readers:
        try:
            job_id = read(json.loads(path.read_text(encoding="utf-8")), key)
        except (OSError, ValueError, TypeError, AttributeError):
            continue  # absent, unreadable, or not the shape we know: the tags search still finds the job
        if job_id is not None:
            found.append((path.stat().st_mtime, job_id, path))
    if not found:
        return None
    _, job_id, path = max(found)
    return job_id, path


def _id_in_terraform_state(state: dict, key: str) -> int | None:
    for resource in state.get("resources", []):
        if resource.get("type") == "databricks_job" and resource.get("name") == key \
                and resource.get("mode", "managed") == "managed":
            for instance in resource.get("instances", []):
                job_id = instance.get("attributes", {}).get("id")
                if job_id:
                    return int(job_id)
    return None


def _id_in_direct_state(state: dict, key: str) -> int | None:
    entry = (state.get("state") or {}).get(f"resources.jobs.{key}")
    return int(entry["__id__"]) if entry and entry.get("__id__") else None


def find_deployed_job(jobs, bundle: BundleTarget, key: str, patience: Patience,
                      current_user: Callable[[], str | None], note: Callable[[str], None]) -> DeployedJob:
    """The job deployed for resource `key` of `bundle`: from local state, else by its tags. Raises DeploymentError."""
    from databricks.sdk.errors import InvalidParameterValue, NotFound

    recorded = job_id_from_local_state(bundle.root, bundle.target, key)
    if recorded is not None:
        job_id, state_file = recorded
        where = state_file.relative_to(bundle.root).as_posix()
        try:
            job = patience.call(f"reading job {job_id}", jobs.get, job_id)
            return DeployedJob(job_id, job.settings.name if job.settings else str(job_id), where)
        except (NotFound, InvalidParameterValue):
            note(f"job {job_id}, recorded in {where}, no longer exists in this workspace; looking for it by its tags")
    return _find_by_tags(jobs, bundle, key, patience, current_user)


def _find_by_tags(jobs, bundle: BundleTarget, key: str, patience: Patience,
                  current_user: Callable[[], str | None]) -> DeployedJob:
    deploy = f"databricks bundle deploy -t {bundle.target}"
    if bundle.name is None:
        raise DeploymentError(f"no local deployment state names job {key!r} for target {bundle.target!r}, and the "
                              f"bundle name {bundle.raw_name!r} has references this command cannot resolve to search "
                              f"the workspace by tags: run `{deploy}` from this folder first")
    wanted = {"bundle": bundle.name, "job_key": key, "target": bundle.target}
    every_job = patience.call("listing the workspace's jobs", lambda: list(jobs.list(limit=100)))
    matches = [job for job in every_job if _carries(job, wanted)]
    if not matches:
        raise DeploymentError(
            f"no job for key {key!r} of bundle {bundle.name!r}, target {bundle.target!r}: none in the local deployment "
            f"state ({(STATE_FOLDER / bundle.target).as_posix()}/) nor among the workspace's jobs with the tags "
            f"{', '.join(f'{tag}={value}' for tag, value in wanted.items())}. Deploy it: `{deploy}` "
            "(and check the key against resources.jobs in the bundle)")
    if len(matches) > 1:
        user = current_user()
        own = [job for job in matches if user is not None and job.creator_user_name == user]
        if len(own) == 1:
            matches = own
    if len(matches) > 1:
        listed = "\n".join(f"  job {job.job_id}: {job.settings.name!r}, created by {job.creator_user_name}"
                           for job in matches)
        raise DeploymentError(f"{len(matches)} jobs carry the tags of key {key!r} of bundle {bundle.name!r}, target "
                              f"{bundle.target!r}:\n{listed}\nremove the stale ones (`databricks jobs delete JOB_ID`) "
                              f"or run from the folder you deployed from, whose local state names the job")
    job = matches[0]
    return DeployedJob(job.job_id, job.settings.name or str(job.job_id), "the workspace's jobs, by tags")


def _carries(job, wanted_tags: dict[str, str]) -> bool:
    tags = (job.settings.tags if job.settings is not None else None) or {}
    return all(tags.get(tag) == value for tag, value in wanted_tags.items())
