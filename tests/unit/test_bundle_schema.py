"""The JSON schema layer against the CLI's own fixtures (<schema dir>/testdata/{pass,fail}/*.yml).

The schema is not part of this repository: set DATABRICKS_BUNDLE_SCHEMA to its path (the output of
`databricks bundle schema`, beside its testdata/) to run these tests.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from distributed_training.tooling.bundle.schema import SCHEMA_ENV
from distributed_training.tooling.bundle.validate import validate_bundle
from distributed_training.tooling.cli import main

SCHEMA = os.environ.get(SCHEMA_ENV)
needs_schema = pytest.mark.skipif(
    not SCHEMA, reason=f"set {SCHEMA_ENV} to the bundle JSON schema file to run the schema tests")
FIXTURES = Path(SCHEMA).parent / "testdata" if SCHEMA else None
BUNDLES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"

# The rules that decide what the schema fixtures are about: the schema itself, the CLI's struct checks (field_kinds.py),
# and the syntax of references (which the schema's patterns also check). The CLI warns about all of them.
SCHEMA_LEVEL_RULES = {"schema", "unknown-field", "required-field", "invalid-enum", "wrong-type", "invalid-reference",
                      "unknown-reference-root", "yaml-syntax"}

# Pass fixtures that `validate` accepts with a warning: `${resources.<key>.id}` without the resource type.
WARNED_PASS_FIXTURES = {
    "pipeline.yml": {"resource-reference-without-type"},
    "run_job_task.yml": {"resource-reference-without-type"},
}

# Pass fixtures that are right for the schema but that the CLI itself refuses once past it.
REFUSED_PAST_THE_SCHEMA = {
    # no bundle.name: the CLI stops defining the workspace root (bundle/config/mutator/default_workspace_root.go)
    "artifact_references.yml": {"bundle-name-missing",
                                # files without a build must match now (bundle/artifacts/expand_globs.go)
                                "artifact-file-missing"},
    # a target assigns a variable the bundle never declares (bundle/config/root.go, validateVariableOverrides)
    "direct_value_in_target.yml": {"bundle-name-missing", "undeclared-target-variable"},
    "target_variable.yml": {"bundle-name-missing", "undeclared-target-variable"},
    "yaml_anchors.yml": {"bundle-name-missing"},
    # ${workspace.current_user.me}: a field no struct has ("reference does not exist", libs/dyn/dynvar/resolve.go; see
    # bundle/config_fields.py), and a grant that resolves to a mapping without principal or privileges
    # (bundle/config/validate/required.go, errorForInvalidGrants)
    "schema.yml": {"reference-does-not-exist", "grant-incomplete"},
    # Its artifact's folder is not among the fixture's files (translate_paths.go:280), and its type WHEEL is not the
    # CLI's whl, so it needs build or files (bundle/artifacts/prepare.go: "misconfigured artifact").
    "pipeline.yml": {"local-path-missing", "artifact-incomplete"},
}

JOB_ID = "resources.jobs.outer.tasks[0].run_job_task.job_id"
MAX_RUNS = "resources.jobs.foo.max_concurrent_runs"
# fail fixture -> (rule, path) pairs that must be among its findings: the reason it is wrong, where it is wrong. The
# schema refuses each; the CLI's loader warns (libs/dyn/convert/normalize.go, bundle/config/validate/required.go,
# enum.go) or reads the value as it is (a readonly or hidden field its structs have): all warnings.
FAIL_REASONS = {
    "basic.yml": {("schema", "bundle.name")},
    "deprecated_job_field_format.yml": {("schema", "resources.jobs.foo.format")},
    "hidden_job_field_deployment.yml": {("schema", "resources.jobs.foo.deployment")},
    "hidden_job_field_edit_mode.yml": {("schema", "targets.foo.resources.jobs.bar.edit_mode")},
    "incorrect_volume_type.yml": {("schema", "resources.volumes.foo.volume_type")},
    "invalid_enum_value_in_job.yml": {("schema", "resources.jobs.myjob.format")},
    "invalid_enum_value_in_model.yml": {("schema", "resources.models.mymodel.latest_versions")},
    "invalid_reference_in_job.yml": {("schema", JOB_ID), ("unknown-reference-root", JOB_ID)},
    "invalid_reference_in_model.yml": {
        ("unknown-reference-root", "resources.models.mymodel.latest_versions[0].creation_timestamp")},
    "invalid_unicode_variable_reference.yml": {("schema", MAX_RUNS), ("invalid-reference", MAX_RUNS),
                                               ("wrong-type", MAX_RUNS)},
    "nfd_unicode_variable_reference.yml": {("schema", MAX_RUNS), ("invalid-reference", MAX_RUNS),
                                           ("wrong-type", MAX_RUNS)},
    "readonly_job_field_git_snapshot.yml": {("schema", "resources.jobs.foo.git_source.git_snapshot")},
    "readonly_job_field_job_source.yml": {("schema", "resources.jobs.foo.git_source.job_source")},
    "required_field_missing_in_job.yml": {("schema", "resources.jobs.foo.tasks[0]"),
                                          ("required-field", "resources.jobs.foo.tasks[0]")},
    "unknown_field_in_job.yml": {("schema", "resources.jobs.myjob.unknown_field"),
                                 ("unknown-field", "resources.jobs.myjob.unknown_field")},
    "unknown_field_in_model.yml": {("schema", "resources.models.mymodel.unknown")},
}
# What the CLI refuses in a fail fixture besides: they have no bundle.name (default_workspace_root.go).
FAIL_FIXTURE_ERRORS = {"bundle-name-missing"}


def fixture_files(kind: str) -> list:
    if FIXTURES is None:
        return [pytest.param(None, marks=needs_schema)]
    return [pytest.param(path, id=path.name) for path in sorted((FIXTURES / kind).glob("*.yml"))]


def validate_file(path: Path, tmp_path: Path) -> list:
    shutil.copy(path, tmp_path / "databricks.yml")
    report = validate_bundle(tmp_path, schema_path=SCHEMA)
    return list(dict.fromkeys(finding for findings in report.values() for finding in findings))


@needs_schema
def test_every_fail_fixture_has_its_expected_reason():
    assert sorted(path.name for path in (FIXTURES / "fail").glob("*.yml")) == sorted(FAIL_REASONS)
    assert len(list((FIXTURES / "pass").glob("*.yml"))) > 0


@pytest.mark.parametrize("path", fixture_files("pass"))
def test_pass_fixture_is_accepted(path, tmp_path):
    findings = validate_file(path, tmp_path)
    refused = REFUSED_PAST_THE_SCHEMA.get(path.name, set())
    assert [str(finding) for finding in findings if finding.rule in SCHEMA_LEVEL_RULES] == []
    assert [str(finding) for finding in findings if finding.is_error and finding.rule not in refused] == []
    assert {finding.rule for finding in findings} == WARNED_PASS_FIXTURES.get(path.name, set()) | refused


@pytest.mark.parametrize("path", fixture_files("fail"))
def test_fail_fixture_is_warned_about_for_the_right_reason_as_the_cli_warns(path, tmp_path):
    findings = validate_file(path, tmp_path)
    reasons = {(finding.rule, finding.path) for finding in findings if not finding.is_error}
    assert FAIL_REASONS[path.name] <= reasons, "\n".join(map(str, findings))
    assert {finding.rule for finding in findings if finding.is_error} <= FAIL_FIXTURE_ERRORS
    assert all(finding.file == "databricks.yml" for finding in findings)
    assert not any("is not valid under any of the given schemas" in finding.message for finding in findings)


@needs_schema
def test_every_fail_fixture_passes_but_not_with_strict_as_with_the_cli(tmp_path, capsys):
    """Given the bundle name they lack, the fail fixtures hold only what the CLI warns about: `validate` exits 0, and
    `validate --strict` exits 1, as `databricks bundle validate --strict` does (cmd/bundle/validate.go: "Warnings are
    not allowed in strict mode")."""
    for path in sorted((FIXTURES / "fail").glob("*.yml")):
        text = path.read_text()
        named = text if re.search(r"^bundle:", text, re.MULTILINE) else "bundle: {name: fixture}\n" + text
        (tmp_path / "databricks.yml").write_text(named)
        assert main(["validate", str(tmp_path), "--schema", SCHEMA]) == 0, path.name
        assert main(["validate", str(tmp_path), "--schema", SCHEMA, "--strict"]) == 1, path.name
    capsys.readouterr()


@needs_schema
def test_wrong_type_is_caught_by_the_schema_in_its_file():
    report = validate_bundle(BUNDLES / "wrong_type_schema", schema_path=SCHEMA)
    [finding] = [finding for finding in report["dev"] if finding.rule == "schema"]
    assert (finding.file, finding.path) == ("resources/train.yml", "resources.jobs.train.max_concurrent_runs")
    assert "'two'" in finding.message and "integer" in finding.message


@needs_schema
def test_good_bundle_passes_the_schema_too():
    assert validate_bundle(BUNDLES / "good", schema_path=SCHEMA) == {"dev": [], "prod": []}
