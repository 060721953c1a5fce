"""`validate [BUNDLE_DIR] [--target T] [--schema FILE]`: check a bundle before `databricks bundle deploy`.

Layers, for every target (or the bundle itself when it declares none):
1. loading: YAML syntax, include globs, resource keys defined twice (see `loader`);
2. the CLI's JSON schema, when one is given: every file, the merged files, each target (see `schema`);
3. every job against the fields and kinds of the CLI's structs (see `field_kinds`);
4. references and variables, and rules the schema cannot express (see `references`, `checks`, `wheel_tasks`),
   serverless GPU tasks among them (`serverless_tasks`), the project files the CLI resolves paths to
   (`local_paths`), and the jobs' arguments to the project's own `train` (`train_arguments`);
5. what the CLI refuses while it initializes the bundle: `run_as`, workspace paths, other resources' fields
   (`resource_fields`), `artifacts`, `scripts`;
6. the compute guards on every cluster that trains (`jobs_and_clusters`), over the project's own node-type catalog
   when it has one (src/<package>/compute/node_types.yaml), else this package's.

Severities follow the Databricks CLI's: what `databricks bundle validate` reports as an error (or what fails the
deploy or the run for certain) is an error; what it warns about, or accepts, is at most a warning.

Exit codes: 0 no errors (warnings are printed), 1 errors (with `--strict`, warnings too, as `databricks bundle validate
--strict`), 2 bad usage (no bundle there, unknown target, unusable schema file).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path as FilePath
from typing import Iterable

from ...compute.catalog import Catalog, CatalogError, default_catalog, load_catalog
from ...findings import Finding
from . import checks
from .artifacts import artifact_findings
from .field_kinds import typed_findings
from .jobs_and_clusters import clusters_of, guard_findings, jobs_with_tasks
from .loader import IMPLICIT_TARGET, Bundle, NotABundle, load_bundle
from .local_paths import local_path_findings
from .merging import merge_keyed_lists
from .paths import get_at, parse_path
from .references import Resolver, reference_findings, substitute
from .resource_fields import resource_field_findings
from .run_as import run_as_findings
from .schema import SCHEMA_ENV, SchemaUnavailable, load_validator, schema_findings
from .scripts import script_findings
from .serverless_tasks import TargetDeploy, serverless_gpu_findings
from .sourced_trees import file_at
from .train_arguments import train_argument_findings
from .variables import (missing_value_findings, read_overrides, target_variables,
                        undeclared_target_variable_findings)
from .wheel_tasks import wheel_library_findings, wheel_task_findings
from .yaml_files import gc_paused


class UnknownTarget(ValueError):
    """A target was asked for that the bundle does not declare."""


def validate_bundle(bundle_dir: str | FilePath, targets: Iterable[str] | None = None,
                    schema_path: str | FilePath | None = None) -> dict[str, list[Finding]]:
    """Validate the bundle in `bundle_dir`; findings per target name, each list complete for its target.

    `targets`: the targets to check (default: every target the bundle declares; a bundle without targets is
    checked as the CLI's implicit target "default"). `schema_path`: the CLI's bundle JSON schema; None skips the
    schema layer. Findings that hold for the whole bundle (a YAML error, a file's schema error) appear in every
    target's list. Raises `NotABundle`, `UnknownTarget` or `SchemaUnavailable` for unusable arguments.
    """
    with gc_paused():  # millions of short-lived objects on a large bundle, no cycles: see `gc_paused`
        return _validate_bundle(bundle_dir, targets, schema_path)


def _validate_bundle(bundle_dir: str | FilePath, targets: Iterable[str] | None,
                     schema_path: str | FilePath | None) -> dict[str, list[Finding]]:
    bundle = load_bundle(bundle_dir)
    validator = load_validator(schema_path) if schema_path is not None else None
    names = _chosen_targets(bundle, targets)
    memo = Memo()
    shared = _bundle_findings(bundle, validator, memo)
    try:
        catalog = project_catalog(bundle.root)
    except CatalogError as error:
        shared.append(Finding("catalog", str(error), "fix the node-type catalog (each family needs every field)"))
        catalog = default_catalog()
    shared_keys = {(finding.rule, finding.message, finding.path) for finding in shared}
    report = {}
    for name in names:
        own = [finding for finding in _target_findings(bundle, name, validator, catalog, memo)
               if not _reported_already(finding, shared_keys, name)]
        report[name] = shared + _unique(own)
    return report


def _chosen_targets(bundle: Bundle, targets: Iterable[str] | None) -> list[str]:
    declared = bundle.target_names or [IMPLICIT_TARGET]
    if targets is None:
        return declared
    chosen = list(targets)
    unknown = [name for name in chosen if name not in declared]
    if unknown and bundle.root_file.data is not None:
        raise UnknownTarget(f"target {', '.join(map(repr, unknown))} is not declared in {bundle.root_file.name} "
                            f"(targets: {', '.join(declared)})")
    return chosen


def _bundle_findings(bundle: Bundle, validator, memo: Memo) -> list[Finding]:
    findings = list(bundle.findings)
    if validator is not None:
        for bundle_file in bundle.files:
            if bundle_file.data is not None:
                findings += schema_findings(validator, bundle_file.data, file=bundle_file.name)
                resources = bundle_file.data.get("resources")
                for kind, of_kind in (resources.items() if isinstance(resources, dict) else ()):
                    for key, resource in (of_kind.items() if isinstance(of_kind, dict) else ()):
                        memo.file_resources.setdefault((kind, key), []).append(resource)
        # The merged files are checked as each target's tree (see `_target_schema_findings`).
    findings += _with_files(checks.default_target_findings(bundle.tree) + script_findings(bundle.tree), bundle.tree)
    return _unique(findings)


@dataclass
class Memo:
    """What the checks of one bundle's targets share, so that a large bundle is parsed once, not once per target:
    the typed parse of each job mapping (a job a target leaves as it is is the same mapping in every target),
    the resources of the files, which the schema has checked already (see `_target_schema_findings`), and what is
    at each local path the bundle names (see `local_path_findings`)."""

    typed: dict = field(default_factory=dict)  # see `typed_findings`
    file_resources: dict = field(default_factory=dict)  # (type, key) -> the resource as each file defines it
    path_kinds: dict = field(default_factory=dict)  # path from the bundle root -> what is there


def _target_schema_findings(validator, tree: dict, memo: Memo) -> list[Finding]:
    """The schema's findings for a target tree, less the resources that are exactly as a file defines them: the
    files' own check (in every target's findings) has said everything about those."""
    resources = tree.get("resources")
    if not isinstance(resources, dict):
        return schema_findings(validator, tree)
    fresh: dict = {}
    for kind, of_kind in resources.items():
        fresh[kind] = of_kind if not isinstance(of_kind, dict) else {
            key: resource for key, resource in of_kind.items()
            if not any(resource == defined for defined in memo.file_resources.get((kind, key), ()))}
    return schema_findings(validator, {**tree, "resources": fresh})


def _target_findings(bundle: Bundle, name: str, validator, catalog: Catalog, memo: Memo) -> list[Finding]:
    tree = bundle.target_tree(name, merge_lists=False)
    overrides, findings = read_overrides(bundle.root, name)
    variables = target_variables(tree, overrides=overrides)
    resolver = Resolver(tree, name, variables)
    merge_keyed_lists(tree, key_of=lambda key: substitute(key, resolver) if isinstance(key, str) and "${" in key
                      else key)
    findings += undeclared_target_variable_findings(bundle.tree, name)
    mode_path = ("targets", name, "mode")
    findings += checks.target_mode_findings(get_at(bundle.tree, mode_path), name, file_at(bundle.tree, mode_path))
    findings += checks.production_root_path_findings(bundle.tree, name, tree)
    findings += _target_schema_findings(validator, tree, memo) if validator is not None else []
    if not _unreadable(bundle.root_file.name, bundle):
        findings += [replace(finding, file=file_at(tree, ("bundle", "name")) or bundle.root_file.name)
                     for finding in checks.bundle_name_findings(tree)]
    findings += checks.resource_shape_findings(tree)
    findings += typed_findings(tree, memo.typed)
    findings += reference_findings(tree, resolver)
    findings += missing_value_findings(variables, name)
    resolved = substitute(tree, resolver)
    jobs = jobs_with_tasks(resolved)  # one walk of every job's tasks for the checks below
    findings += checks.job_cluster_key_findings(jobs)
    clusters = list(clusters_of(resolved, jobs))  # one walk for both checks of every cluster
    findings += checks.single_node_findings(clusters)
    findings += checks.num_nodes_findings(resolved, jobs)
    findings += serverless_gpu_findings(TargetDeploy.of(bundle.root, name, resolved, target_mode(bundle, name)), jobs)
    findings += local_path_findings(resolved, tree, bundle.root, memo.path_kinds, jobs)
    findings += wheel_library_findings(jobs)
    findings += wheel_task_findings(bundle.root, jobs)
    findings += train_argument_findings(bundle.root, jobs, name)
    findings += guard_findings(clusters, catalog)
    findings += run_as_findings(resolved)
    findings += checks.volume_workspace_path_findings(resolved)
    findings += resource_field_findings(resolved)
    findings += artifact_findings(resolved, tree, bundle.root)
    return _with_files(findings, tree)


def target_mode(bundle: Bundle, name: str) -> object:
    """The target's `mode` (development, production), else the root's `bundle.mode`; None when neither sets one."""
    section = bundle.tree.get("targets", {}).get(name) if isinstance(bundle.tree.get("targets"), dict) else None
    if isinstance(section, dict) and section.get("mode") is not None:
        return section["mode"]
    root_bundle = bundle.tree.get("bundle")
    return root_bundle.get("mode") if isinstance(root_bundle, dict) else None


def _unreadable(name: str, bundle: Bundle) -> bool:
    """Whether loading reported an error for the file `name` (its content is then unknown, not empty)."""
    return any(finding.file == name and finding.is_error for finding in bundle.findings)


def project_catalog(bundle_root: FilePath) -> Catalog:
    """The node-type catalog a generated project carries (and its user may have edited), else this package's."""
    for path in sorted(bundle_root.glob("src/*/compute/node_types.yaml")):
        return load_catalog(path)
    return default_catalog()


def _with_files(findings: list[Finding], tree) -> list[Finding]:
    """Each finding with its file: the one that defined the deepest part of its path in `tree`."""
    located = []
    for finding in findings:
        if finding.file is None and finding.path:
            finding = replace(finding, file=file_at(tree, _tree_path(finding.path)))
        located.append(finding)
    return located


def _tree_path(path: str):
    try:
        return parse_path(path)
    except ValueError:  # a path written by other code in another style: name the file of its first key
        return (path.split(".")[0],)


def _reported_already(finding: Finding, shared_keys: set[tuple], target: str) -> bool:
    """Whether a bundle-wide finding (its rule, message and path in `shared_keys`) already says this (a target's
    tree repeats the root's and the target's own section's errors, at `path` or `targets.<target>.path`)."""
    same_place = [finding.path] if finding.path is None else [finding.path, f"targets.{target}.{finding.path}"]
    return any((finding.rule, finding.message, path) in shared_keys for path in same_place)


def _unique(findings: list[Finding]) -> list[Finding]:
    return list(dict.fromkeys(findings))


def format_report(report: dict[str, list[Finding]]) -> str:
    """Findings shared by every target once, then each target's own, then a summary line."""
    names = list(report)
    first, *others = [report[name] for name in names] or [[]]
    in_others = [set(other) for other in others]
    common = [finding for finding in first if all(finding in other for other in in_others)]
    common_set = set(common)
    lines = []
    if common:
        if len(names) > 1:
            lines.append(f"== every target ({', '.join(names)}) ==")
        lines += [str(finding) for finding in common]
    for name in names:
        own = [finding for finding in report[name] if finding not in common_set]
        if own:
            lines.append(f"== target {name} ==")
            lines += [str(finding) for finding in own]
    every = _unique([finding for findings in report.values() for finding in findings])
    per_target = "; ".join(f"{name}: {_counts(report[name])}" for name in names)
    lines.append(f"{_counts(every)} ({per_target})")
    return "\n".join(lines)


def _counts(findings: list[Finding]) -> str:
    errors = sum(finding.is_error for finding in findings)
    warnings = len(findings) - errors
    return f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle_dir", nargs="?", default=".", metavar="BUNDLE_DIR",
                        help="the folder that holds databricks.yml (default: the current folder)")
    parser.add_argument("--target", "-t", metavar="T", help="check only this target (default: every target)")
    parser.add_argument("--schema", metavar="FILE",
                        help=f"the CLI's bundle JSON schema (`databricks bundle schema > FILE`); default: "
                             f"${SCHEMA_ENV}, else the schema check is skipped")
    parser.add_argument("--strict", action="store_true",
                        help="fail on warnings too, as `databricks bundle validate --strict` does")


def run(args: argparse.Namespace) -> int:
    schema_path = args.schema or os.environ.get(SCHEMA_ENV) or None
    try:
        report = validate_bundle(args.bundle_dir, [args.target] if args.target else None, schema_path)
    except (NotABundle, UnknownTarget, SchemaUnavailable) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if schema_path is None:
        print(f"schema: skipped (pass --schema FILE or set {SCHEMA_ENV}; `databricks bundle schema` writes one)")
    else:
        print(f"schema: {schema_path}")
    print(format_report(report))
    every = [finding for findings in report.values() for finding in findings]
    if any(finding.is_error for finding in every):
        return 1
    if args.strict and every:
        warnings = len(set(every))
        print(f"error: {warnings} warning{'s' * (warnings != 1)} found, and --strict allows none", file=sys.stderr)
        return 1
    return 0
