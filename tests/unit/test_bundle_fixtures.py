"""Hand-broken bundles (tests/fixtures/bundles): each refused for its one defect, at the right file and path.

These run without the JSON schema (as `validate` does when none is given): every defect here is caught by the
loader, the typed classes, the reference rules, the semantic checks or the guards. The schema-only case lives
in test_bundle_schema.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_training.bundle.validate import validate_bundle

BUNDLES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"
JOB_FILE = "resources/train.yml"
CLUSTER = "resources.jobs.train.job_clusters[0].new_cluster"
TASK = "resources.jobs.train.tasks[0]"


def errors(report: dict) -> set[tuple[str, str | None, str | None]]:
    return {(finding.rule, finding.file, finding.path)
            for findings in report.values() for finding in findings if finding.is_error}


@pytest.mark.parametrize("bundle, expected", [
    ("dangling_job_cluster_key", ("dangling-job-cluster-key", JOB_FILE, f"{TASK}.job_cluster_key")),
    ("undefined_variable", ("undefined-variable", JOB_FILE, f"{TASK}.python_wheel_task.parameters[3]")),
    ("dangling_resource_reference", ("dangling-resource-reference", "resources/orchestrate.yml",
                                     "resources.jobs.orchestrate.tasks[0].run_job_task.job_id")),
    ("duplicate_resource_key", ("duplicate-resource-key", "resources/train_copy.yml", "resources.jobs.train")),
    ("include_matches_nothing", ("include-matches-nothing", "databricks.yml", "include[1]")),
    ("wheel_entry_point_missing", ("wheel-entry-point-missing", JOB_FILE, f"{TASK}.python_wheel_task.entry_point")),
    ("production_without_root_path", ("production-without-root-path", "databricks.yml", "targets.prod")),
    ("single_node_incomplete", ("single-node-incomplete", JOB_FILE, f"{CLUSTER}.num_workers")),
    ("single_node_mixed_forms", ("single-node-mixed-forms", JOB_FILE, CLUSTER)),
    ("unknown_field_typed", ("typed", JOB_FILE, f"{CLUSTER}.autotermination_minute")),
    ("yaml_syntax_error", ("yaml-syntax", JOB_FILE, None)),
    ("guard_azure_nc_multi_node", ("azure-nc-multi-node", JOB_FILE, f"{CLUSTER}.num_workers")),
])
def test_broken_bundle_is_refused_for_its_defect_only(bundle, expected):
    assert errors(validate_bundle(BUNDLES / bundle)) == {expected}


def test_yaml_syntax_error_names_the_line():
    [finding] = validate_bundle(BUNDLES / "yaml_syntax_error")["dev"]
    assert "line 15" in finding.message


def test_good_bundle_is_clean_in_every_target():
    report = validate_bundle(BUNDLES / "good")
    assert report == {"dev": [], "prod": []}


def test_target_override_is_blamed_on_the_file_that_makes_it():
    report = validate_bundle(BUNDLES / "target_overrides")
    assert report["dev"] == []
    assert {(finding.rule, finding.file, finding.path) for finding in report["prod"]} == {
        ("variable-without-value", "databricks.yml", "variables.schema"),
        ("single-node-incomplete", "databricks.yml", f"{CLUSTER}.num_workers"),
    }


def test_one_target_can_be_chosen():
    assert list(validate_bundle(BUNDLES / "target_overrides", targets=["dev"])) == ["dev"]


def test_without_the_typed_classes_one_warning_says_how_to_install_them(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "databricks.bundles.jobs", None)
    report = validate_bundle(BUNDLES / "unknown_field_typed")
    [finding] = report["dev"]
    assert (finding.rule, finding.severity) == ("typed-classes-missing", "warning")
    assert "pip install databricks-bundles" in finding.fix
