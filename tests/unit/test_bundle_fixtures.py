"""Hand-broken bundles (tests/fixtures/bundles): each refused for its one defect, at the right file and path.

These run without the JSON schema (as `validate` does when none is given): every defect here is caught by the
loader, the typed classes, the reference rules, the semantic checks or the guards. The schema-only case lives
in test_bundle_schema.py. Below them: bundles written per test, for the cluster forms the guards walk and for the
paths of serverless GPU tasks.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from textwrap import dedent

import pytest
import yaml

from distributed_training.tooling.bundle.validate import validate_bundle

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
    ("include_matches_nothing", ("include-file-missing", "databricks.yml", "include[1]")),
    ("wheel_entry_point_missing", ("wheel-entry-point-missing", JOB_FILE, f"{TASK}.python_wheel_task.entry_point")),
    ("single_node_mixed_forms", ("single-node-mixed-forms", JOB_FILE, CLUSTER)),
    ("yaml_syntax_error", ("yaml-syntax", JOB_FILE, None)),
    # its own catalog (src/example/compute/node_types.yaml) is from before the NCv3 retirement
    ("guard_azure_nc_multi_node", ("azure-nc-multi-node", JOB_FILE, f"{CLUSTER}.num_workers")),
    ("guard_retired_node_type", ("retired-node-type", JOB_FILE, f"{CLUSTER}.node_type_id")),
])
def test_broken_bundle_is_refused_for_its_defect_only(bundle, expected):
    assert errors(validate_bundle(BUNDLES / bundle)) == {expected}


@pytest.mark.parametrize("bundle, expected", [
    # the CLI warns "Single node cluster is not correctly configured" (bundle/config/validate/single_node_cluster.go)
    ("single_node_incomplete", ("single-node-incomplete", JOB_FILE, f"{CLUSTER}.num_workers")),
    # the CLI warns "unknown field: autotermination_minute" and drops it (libs/dyn/convert/normalize.go)
    ("unknown_field_typed", ("unknown-field", JOB_FILE, f"{CLUSTER}.autotermination_minute")),
    # the CLI refuses it when a user deploys, recommends it when a service principal does
    # (bundle/config/mutator/resourcemutator/validate_target_mode.go): who deploys is unknown offline
    ("production_without_root_path", ("production-without-root-path", "databricks.yml", "targets.prod")),
])
def test_a_defect_the_cli_warns_about_is_a_warning_for_its_defect_only(bundle, expected):
    report = validate_bundle(BUNDLES / bundle)
    assert errors(report) == set()
    assert {(finding.rule, finding.file, finding.path) for findings in report.values() for finding in findings} == {
        expected}


def test_yaml_syntax_error_names_the_line():
    [finding] = validate_bundle(BUNDLES / "yaml_syntax_error")["dev"]
    assert "line 15" in finding.message


def test_good_bundle_is_clean_in_every_target():
    report = validate_bundle(BUNDLES / "good")
    assert report == {"dev": [], "prod": []}


def test_target_override_is_blamed_on_the_file_that_makes_it():
    report = validate_bundle(BUNDLES / "target_overrides")
    assert report["dev"] == []
    assert {(finding.rule, finding.severity, finding.file, finding.path) for finding in report["prod"]} == {
        ("variable-without-value", "error", "databricks.yml", "variables.schema"),
        ("single-node-incomplete", "warning", "databricks.yml", f"{CLUSTER}.num_workers"),
    }


def test_one_target_can_be_chosen():
    assert list(validate_bundle(BUNDLES / "target_overrides", targets=["dev"])) == ["dev"]


def test_without_the_typed_classes_one_warning_says_how_to_install_them(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "databricks.bundles.jobs", None)
    report = validate_bundle(BUNDLES / "good")
    [finding] = report["dev"]
    assert (finding.rule, finding.severity) == ("typed-classes-missing", "warning")
    assert "pip install databricks-bundles" in finding.fix


def write_bundle(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(dedent(text))
    return folder


def all_findings(bundle_dir: Path) -> set[tuple[str, str, str | None, str | None]]:
    return {(finding.rule, finding.severity, finding.file, finding.path)
            for finding in validate_bundle(bundle_dir)["dev"]}


ROOT = """
    bundle: {name: written}
    include: [resources/*.yml]
    targets: {dev: {mode: development, default: true}}
    """


# ---------------------------------------------------------------- every cluster form the guards walk

NC_MULTI_NODE = """{spark_version: 17.3.x-gpu-ml-scala2.13, node_type_id: Standard_NC24s_v3, num_workers: 2,
                    data_security_mode: SINGLE_USER, spark_conf: {spark.task.resource.gpu.amount: "1"}}"""
WHEEL = '{package_name: example, entry_point: train, parameters: ["--engine", "torch_distributor"]}'


@pytest.fixture
def nc_clusters_everywhere(tmp_path) -> Path:
    """A multi-node NC-series cluster inside a for_each_task's task, and an all-purpose one under
    resources.clusters that a task names; the project's catalog is from before the NCv3 retirement."""
    shutil.copytree(BUNDLES / "guard_azure_nc_multi_node" / "src", tmp_path / "src")
    return write_bundle(tmp_path, {"databricks.yml": ROOT, "resources/train.yml": f"""
        resources:
          jobs:
            train:
              name: train
              tasks:
                - task_key: sweep
                  for_each_task:
                    inputs: "[1, 2]"
                    task:
                      task_key: sweep_one
                      new_cluster: {NC_MULTI_NODE}
                      python_wheel_task: {WHEEL}
                      libraries: [{{whl: ../dist/*.whl}}]
                - task_key: on_shared
                  existing_cluster_id: ${{resources.clusters.shared.id}}
                  python_wheel_task: {WHEEL}
        """, "resources/shared.cluster.yml": f"""
        resources:
          clusters:
            shared: {NC_MULTI_NODE}
        """})


def test_multi_node_nc_series_is_refused_in_a_for_each_task_and_an_all_purpose_cluster(nc_clusters_everywhere):
    """Databricks' distributed-training docs for Azure: no multi-node training on NC-series; `validate` walks every
    cluster form (bundle/jobs_and_clusters.py), for_each_task and resources.clusters included."""
    assert all_findings(nc_clusters_everywhere) == {
        ("azure-nc-multi-node", "error", "resources/train.yml",
         "resources.jobs.train.tasks[0].for_each_task.task.new_cluster.num_workers"),
        ("azure-nc-multi-node", "error", "resources/shared.cluster.yml", "resources.clusters.shared.num_workers"),
    }


def test_without_the_projects_catalog_the_same_clusters_are_retired(nc_clusters_everywhere):
    """This package's catalog records Microsoft's NCv3 retirement (2025-09-30): the same two clusters are refused
    as retired, at their node_type_id."""
    shutil.rmtree(nc_clusters_everywhere / "src")
    assert {(rule, path) for rule, _, _, path in all_findings(nc_clusters_everywhere)} == {
        ("retired-node-type", "resources.jobs.train.tasks[0].for_each_task.task.new_cluster.node_type_id"),
        ("retired-node-type", "resources.clusters.shared.node_type_id"),
    }


# ---------------------------------------------------------------- serverless GPU task paths

GPU_TASK = "resources.jobs.train.tasks[0]"
CODE_SOURCE = f"{GPU_TASK}.ai_runtime_task.code_source_path"
COMMAND = f"{GPU_TASK}.ai_runtime_task.deployments[0].command_path"
# A development target as the template writes it for serverless GPU: source-linked deployment off, so that a deploy
# from a workspace Git folder packages code_source_path too (bundle/config/mutator/aicode/validate.go).
SERVERLESS_ROOT = """
    bundle: {name: written}
    include: [resources/*.yml]
    targets: {dev: {mode: development, default: true, presets: {source_linked_deployment: false}}}
    """
PROJECT_FILES = {"databricks.yml": SERVERLESS_ROOT, "src/command.sh": "torchrun -m example\n",
                 "src/example/__init__.py": ""}


def serverless_bundle(folder: Path, code_source_path: str = "src",
                      command_path: str = "${workspace.file_path}/src/command.sh",
                      for_each: bool = False, git_source: bool = False) -> Path:
    """One serverless GPU job in resources/train.yml, with the paths given."""
    task = {"task_key": "train", "environment_key": "gpu", "ai_runtime_task": {
        "experiment": "written", "code_source_path": code_source_path,
        "deployments": [{"name": "train", "command_path": command_path,
                         "compute": {"accelerator_type": "GPU_1xA10", "accelerator_count": 1}}]}}
    if for_each:
        task = {"task_key": "sweep", "for_each_task": {"inputs": "[1]", "task": task}}
    job = {"name": "train", "environments": [{"environment_key": "gpu", "spec": {"environment_version": "4"}}],
           "tasks": [task]}
    if git_source:
        job["git_source"] = {"git_url": "https://github.com/x/y", "git_provider": "gitHub", "git_branch": "main"}
    resources = yaml.safe_dump({"resources": {"jobs": {"train": job}}}, sort_keys=False)
    return write_bundle(folder, {**PROJECT_FILES, "resources/train.yml": resources})


def test_the_paths_the_template_writes_pass(tmp_path):
    """code_source_path `src` (from the bundle root) and command_path `${workspace.file_path}/src/command.sh`, as
    databricks/bundle-examples contrib/templates/air-training writes them."""
    assert all_findings(serverless_bundle(tmp_path)) == set()


@pytest.mark.parametrize("changes, expected", [
    # bundle/config/mutator/aicode/validate.go in databricks/cli v1.13.0: a local code_source_path is joined onto
    # the bundle (sync) root, not the YAML file's folder, and must stay inside the bundle
    ({"code_source_path": "../src"}, ("code-source-outside-bundle", "error", CODE_SOURCE)),
    # aicode/validate.go leaves a path that is no folder to the artifact upload (TestValidateNonDirectoryCodeSource-
    # IsSkipped, bundle/libraries/remote_path.go): with nothing there and no artifact that builds it, there is
    # nothing to upload
    ({"code_source_path": "source"}, ("code-source-missing", "error", CODE_SOURCE)),
    # aicode/validate.go: a local code_source_path is rejected inside for_each_task and with git_source
    ({"for_each": True}, ("code-source-in-for-each", "error", "resources.jobs.train.tasks[0].for_each_task.task."
                                                            "ai_runtime_task.code_source_path")),
    ({"git_source": True}, ("code-source-with-git-source", "error", CODE_SOURCE)),
    # bundle/config/mutator/paths/job_paths_visitor.go in databricks/cli v1.13.0: ${workspace.file_path}/<path>
    # names a synced file of the project
    ({"command_path": "${workspace.file_path}/src/train.sh"}, ("command-file-missing", "error", COMMAND)),
    ({"command_path": "${workspace.file_path}/../command.sh"}, ("command-file-missing", "error", COMMAND)),
    # a relative command_path is read from the folder of the YAML file that sets it (here resources/), as every
    # local path the CLI translates (see tests/failures/test_missing_local_paths.py)
    ({"command_path": "src/command.sh"}, ("local-path-missing", "error", COMMAND)),
    # the platform runs the script at a workspace path on each node, as databricks/bundle-examples
    # contrib/templates/air-training syncs it: a volume path is a warning
    ({"command_path": "/Volumes/main/default/v/command.sh"}, ("serverless-gpu-command-path", "warning", COMMAND)),
])
def test_a_serverless_path_the_cli_would_refuse_is_reported_where_it_is_written(tmp_path, changes, expected):
    rule, severity, path = expected
    assert all_findings(serverless_bundle(tmp_path, **changes)) == {(rule, severity, "resources/train.yml", path)}


@pytest.mark.parametrize("changes", [
    {"command_path": "../src/command.sh"},  # relative to resources/, the CLI's reading of it
    {"code_source_path": "./src/"},
    # a file is uploaded as it is, a prebuilt tarball (aicode/validate.go, TestValidateNonDirectoryCodeSourceIsSkipped)
    {"code_source_path": "src/command.sh"},
    {"code_source_path": "/Workspace/Shared/code"},  # a workspace or volume path is not the project's to check
    {"code_source_path": "/Volumes/main/default/code", "for_each": True},
])
def test_a_serverless_path_the_cli_accepts_passes(tmp_path, changes):
    assert all_findings(serverless_bundle(tmp_path, **changes)) == set()
