"""Loading a bundle the way the Databricks CLI does: YAML, includes, target merging, variables, references."""

from __future__ import annotations

import sys
from pathlib import Path
from textwrap import dedent

import pytest

from distributed_training.tooling.bundle.loader import NotABundle, load_bundle
from distributed_training.tooling.bundle.paths import format_path, parse_path
from distributed_training.tooling.bundle.references import Resolver, references_in, substitute
from distributed_training.tooling.bundle.sourced_trees import file_at
from distributed_training.tooling.bundle.validate import validate_bundle
from distributed_training.tooling.bundle.variables import target_variables

BUNDLES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"


def write_bundle(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(dedent(text))
    return folder


def test_target_merges_job_clusters_and_tasks_by_their_keys():
    bundle = load_bundle(BUNDLES / "target_overrides")
    prod = bundle.target_tree("prod")
    job = prod["resources"]["jobs"]["train"]
    [cluster], [task] = job["job_clusters"], job["tasks"]
    new_cluster = cluster["new_cluster"]
    assert (new_cluster["num_workers"], new_cluster["node_type_id"]) == (0, "Standard_NC24ads_A100_v4")
    assert (task["max_retries"], task["python_wheel_task"]["entry_point"]) == (1, "train")
    assert file_at(prod, parse_path("resources.jobs.train.job_clusters[0].new_cluster.num_workers")) == "databricks.yml"
    assert file_at(prod, parse_path("resources.jobs.train.job_clusters[0].new_cluster.node_type_id")) == \
        "resources/train.yml"
    assert bundle.target_tree("dev")["resources"]["jobs"]["train"]["job_clusters"][0]["new_cluster"]["num_workers"] == 2


def test_lists_that_have_no_key_concatenate_and_scalars_override(tmp_path):
    bundle = load_bundle(write_bundle(tmp_path, {"databricks.yml": """
        bundle: {name: lists}
        permissions: [{level: CAN_VIEW, group_name: readers}]
        workspace: {host: https://one.example}
        targets:
          prod:
            permissions: [{level: CAN_MANAGE, group_name: admins}]
            workspace: {host: https://two.example}
        """}))
    prod = bundle.target_tree("prod")
    assert [item["group_name"] for item in prod["permissions"]] == ["readers", "admins"]
    assert prod["workspace"]["host"] == "https://two.example"
    assert "targets" not in prod


def test_target_variables_plain_value_or_default_and_environment(tmp_path):
    bundle = load_bundle(write_bundle(tmp_path, {"databricks.yml": """
        bundle: {name: variables}
        variables:
          a: {default: root}
          b: {description: none}
          c: {lookup: {cluster: shared}}
        targets:
          dev: {variables: {a: plain, b: {default: given}}}
          prod: {}
        """}))
    dev = target_variables(bundle.target_tree("dev"), environ={})
    assert (dev["a"].value, dev["b"].value, dev["c"].is_lookup) == ("plain", "given", True)
    prod = target_variables(bundle.target_tree("prod"), environ={"BUNDLE_VAR_b": "from env"})
    assert (prod["a"].value, prod["b"].value) == ("root", "from env")
    assert not target_variables(bundle.target_tree("prod"), environ={})["b"].has_value


def test_references_resolve_and_substitute_in_a_target(tmp_path):
    bundle = load_bundle(write_bundle(tmp_path, {"databricks.yml": """
        bundle: {name: refs}
        variables:
          workers: {default: 2}
          sizes: {type: complex, default: {small: [1, 2]}}
          prefix: {default: "${bundle.name}-${bundle.target}"}
          cluster: {lookup: {cluster: shared}}
        resources:
          jobs:
            train:
              name: "${var.prefix}-train"
              max_concurrent_runs: ${var.sizes.small[1]}
              tasks:
                - task_key: t
                  existing_cluster_id: ${var.cluster}
                  run_job_task: {job_id: "${var.workers}"}
        targets: {dev: {}}
        """}))
    tree = bundle.target_tree("dev")
    resolver = Resolver(tree, "dev", target_variables(tree, environ={}))
    job = substitute(tree, resolver)["resources"]["jobs"]["train"]
    assert (job["name"], job["max_concurrent_runs"]) == ("refs-dev-train", 2)
    assert job["tasks"][0]["run_job_task"]["job_id"] == 2
    assert job["tasks"][0]["existing_cluster_id"] == "${var.cluster}"  # a lookup: known at deploy time only
    assert validate_bundle(tmp_path) == {"dev": []}


def test_reference_names_follow_the_cli_letters_rule():
    [cjk, emoji, nfd, index] = references_in("${var.变量} ${var.🌍} ${var.cafe\u0301} ${var.sizes.small[0]}")
    assert cjk.path == ("var", "变量")
    assert emoji.path is None and nfd.path is None
    assert index.path == ("var", "sizes", "small", 0)


def test_yaml_is_read_as_yaml_1_2_like_the_cli(tmp_path):
    bundle = load_bundle(write_bundle(tmp_path, {"databricks.yml": """
        bundle: {name: yaml12}
        variables:
          answer: {default: yes}
          day: {default: 2024-01-31}
          flag: {default: true}
        """}))
    defaults = {name: variable["default"] for name, variable in bundle.tree["variables"].items()}
    assert defaults == {"answer": "yes", "day": "2024-01-31", "flag": True}


def test_a_key_repeated_in_one_file_is_a_warning_with_its_lines(tmp_path):
    write_bundle(tmp_path, {"databricks.yml": """
        bundle: {name: twice}
        resources:
          jobs:
            train: {name: first}
            train: {name: second}
        """})
    [finding] = validate_bundle(tmp_path)["default"]
    # libs/dyn/yamlloader/loader.go keeps the later value (the node tree has both keys; the later one is set last)
    assert (finding.rule, finding.severity, finding.file, finding.path) == (
        "duplicate-key", "warning", "databricks.yml", "resources.jobs.train")
    assert "lines 5 and 6" in finding.message and "keeps the later one" in finding.message


def test_a_resource_key_is_unique_across_resource_types(tmp_path):
    write_bundle(tmp_path, {"databricks.yml": """
        bundle: {name: types}
        include: [resources/*.yml]
        """, "resources/a.yml": "resources: {jobs: {train: {name: job}}}",
        "resources/b.yml": "resources: {pipelines: {train: {name: pipeline}}}"})
    [finding] = validate_bundle(tmp_path)["default"]
    assert (finding.rule, finding.file, finding.path) == ("duplicate-resource-key", "resources/b.yml",
                                                          "resources.pipelines.train")


def test_a_broken_root_file_is_a_finding_not_a_traceback(tmp_path):
    write_bundle(tmp_path, {"databricks.yml": "bundle:\n  name: [unclosed\n"})
    [finding] = validate_bundle(tmp_path, targets=["dev"])["dev"]
    assert (finding.rule, finding.file) == ("yaml-syntax", "databricks.yml")
    assert "line 3" in finding.message


def test_a_folder_without_databricks_yml_is_not_a_bundle(tmp_path):
    with pytest.raises(NotABundle, match="no databricks.yml"):
        load_bundle(tmp_path)


def test_several_default_targets_are_refused(tmp_path):
    write_bundle(tmp_path, {"databricks.yml": """
        bundle: {name: defaults}
        targets:
          dev: {default: true}
          staging: {default: true}
        """})
    assert {(finding.rule, finding.path) for finding in validate_bundle(tmp_path, targets=["dev"])["dev"]} == {
        ("several-default-targets", "targets.staging.default")}


@pytest.mark.parametrize("path", [
    ("resources", "jobs", "train", "tasks", 0, "job_cluster_key"),
    ("resources", "jobs", "train", "job_clusters", 0, "new_cluster", "spark_conf", "spark.master"),
])
def test_paths_read_back_as_written(path):
    assert parse_path(format_path(path)) == path
    assert format_path(path).startswith("resources.jobs.train.")


def test_resources_of_the_wrong_shape_are_found_even_without_the_schema(tmp_path):
    """The CLI's loader drops a value of the wrong kind with a warning (libs/dyn/convert/normalize.go); a resource
    left empty stops it (bundle/config/validate/all_resources_have_values.go: "job train is not defined")."""
    write_bundle(tmp_path, {"databricks.yml": """
        bundle: {name: shapes}
        resources:
          jobs: [train]
          pipelines:
            etl:
          schemas:
        """})
    findings = validate_bundle(tmp_path)["default"]
    assert [(finding.rule, finding.severity, finding.path) for finding in findings] == [
        ("not-a-mapping", "warning", "resources.jobs"), ("resource-not-defined", "error", "resources.pipelines.etl")]


def test_includes_are_matched_as_the_cli_matches_them(tmp_path):
    """bundle/config/loader/process_root_includes.go: a match is taken relative to the bundle root (so
    ./databricks.yml is the root file, skipped like every root file name), Go's glob matches hidden files, and
    the matches of one entry load in sorted order."""
    write_bundle(tmp_path, {
        "databricks.yml": "bundle: {name: x}\ninclude: [./databricks.yml, ./*.yml, resources/*.yml]\n",
        "resources/b.yml": "resources: {jobs: {b: {name: b}}}",
        "resources/.a.yml": "resources: {jobs: {a: {name: a}}}"})
    bundle = load_bundle(tmp_path)
    hidden = ["resources/.a.yml"] if sys.version_info >= (3, 11) else []  # glob's include_hidden is 3.11+
    assert [file.name for file in bundle.files] == ["databricks.yml", *hidden, "resources/b.yml"]
    assert bundle.findings == []


def test_several_root_files_are_refused_like_the_cli(tmp_path):
    """bundle/config/filename.go (FindInPath): "multiple bundle root configuration files found"."""
    write_bundle(tmp_path, {"databricks.yml": "bundle: {name: x}\n", "bundle.yml": "bundle: {name: y}\n"})
    [finding] = validate_bundle(tmp_path)["default"]
    assert (finding.rule, finding.file) == ("several-root-files", "bundle.yml")
    assert "keep databricks.yml" in finding.fix


def test_a_file_that_grows_after_its_size_was_taken_is_read_whole_and_still_bounded(tmp_path, monkeypatch):
    """The size from the stat sizes the read, and a file that grew since is read on, up to the limit."""
    import os

    from distributed_training.tooling.bundle import yaml_files

    file = tmp_path / "databricks.yml"
    file.write_text("bundle:\n  name: grown\n" + "# a comment\n" * 20)
    real_stat = os.stat

    def stat_from_when_it_was_short(path, *args, **kwargs):
        info = real_stat(path, *args, **kwargs)
        return os.stat_result((*info[:6], 10, *info[7:10])) if str(path) == str(file) else info

    monkeypatch.setattr(yaml_files.os, "stat", stat_from_when_it_was_short)
    loaded = yaml_files.load_yaml(file, "databricks.yml")
    assert loaded.data == {"bundle": {"name": "grown"}} and loaded.findings == []
    monkeypatch.setattr(yaml_files, "MAX_FILE_BYTES", 100)
    assert [finding.rule for finding in yaml_files.load_yaml(file, "databricks.yml").findings] == ["yaml-too-large"]


def test_validating_leaves_nothing_to_the_cyclic_collector():
    """`validate` holds the cyclic collector off while it runs (`gc_paused`), so what it makes must be freed by
    reference counting alone: one reference cycle per file (a parser kept by a nested function that called itself)
    kept every file's parser until the end, a gigabyte on a bundle of 50,000 files, and a third of its time."""
    import gc

    bundles = [BUNDLES / "good", BUNDLES / "target_overrides", BUNDLES / "duplicate_resource_key"]
    for bundle in bundles:
        validate_bundle(bundle)  # imports and caches first: they make cycles of their own, once
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        for bundle in bundles:
            validate_bundle(bundle)
            assert gc.collect() == 0, bundle.name
    finally:
        if enabled:
            gc.enable()
