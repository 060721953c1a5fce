"""Which target and which deployed job `run` means: targets, bundle name, local deployment state files."""

from __future__ import annotations

import json
import os

import pytest

from distributed_training.tooling.remote.deployment import (
    DeploymentError, choose_target, job_id_from_local_state, read_bundle_target,
)


def test_the_target_is_the_requested_else_the_default_else_the_only_one():
    assert choose_target(["dev", "prod"], ["dev"], "prod", "databricks.yml") == "prod"
    assert choose_target(["dev", "prod"], ["prod"], None, "databricks.yml") == "prod"
    assert choose_target(["staging"], [], None, "databricks.yml") == "staging"
    assert choose_target([], [], None, "databricks.yml") == "default"
    with pytest.raises(DeploymentError, match=r"marks no target as default \(targets: dev, prod\); fix: pass --target dev"):
        choose_target(["dev", "prod"], [], None, "databricks.yml")
    with pytest.raises(DeploymentError, match="'qa' is not declared in databricks.yml"):
        choose_target(["dev", "prod"], ["dev"], "qa", "databricks.yml")


def test_the_bundle_name_resolves_variables_and_a_target_may_override_it(tmp_path, monkeypatch):
    monkeypatch.delenv("BUNDLE_VAR_project", raising=False)
    (tmp_path / "databricks.yml").write_text(
        "bundle: {name: '${var.project}-training'}\n"
        "variables: {project: {default: trips}}\n"
        "workspace: {profile: team}\n"
        "targets:\n"
        "  dev: {default: true}\n"
        "  prod: {bundle: {name: trips-prod}, variables: {project: ignored}}\n")

    dev = read_bundle_target(tmp_path, None)
    assert (dev.target, dev.name, dev.profile) == ("dev", "trips-training", "team")
    assert read_bundle_target(tmp_path, "prod").name == "trips-prod"
    monkeypatch.setenv("BUNDLE_VAR_project", "taxi")
    assert read_bundle_target(tmp_path, "dev").name == "taxi-training"


def test_a_bundle_name_with_unresolvable_references_is_kept_raw(tmp_path):
    (tmp_path / "databricks.yml").write_text("bundle: {name: '${workspace.current_user.short_name}-x'}\n")
    bundle = read_bundle_target(tmp_path, None)
    assert bundle.name is None and bundle.raw_name == "${workspace.current_user.short_name}-x"
    assert bundle.target == "default"


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _terraform_state(key, job_id):
    return {"version": 4, "resources": [
        {"mode": "data", "type": "databricks_job", "name": key, "instances": [{"attributes": {"id": "1"}}]},
        {"mode": "managed", "type": "databricks_pipeline", "name": key, "instances": [{"attributes": {"id": "2"}}]},
        {"mode": "managed", "type": "databricks_job", "name": key, "instances": [{"attributes": {"id": str(job_id)}}]},
    ]}


def test_local_state_of_either_engine_names_the_job_and_the_newer_file_wins(tmp_path):
    folder = tmp_path / ".databricks" / "bundle" / "dev"
    assert job_id_from_local_state(tmp_path, "dev", "train") is None

    terraform = _write(folder / "terraform" / "terraform.tfstate", _terraform_state("train", 41))
    assert job_id_from_local_state(tmp_path, "dev", "train") == (41, terraform)
    assert job_id_from_local_state(tmp_path, "dev", "eval") is None
    assert job_id_from_local_state(tmp_path, "prod", "train") is None

    direct = _write(folder / "resources.json", {"state_version": 2, "lineage": "l", "serial": 1, "state": {
        "resources.jobs.train": {"__id__": "42", "state": {"name": "train"}},
        "resources.pipelines.train": {"__id__": "abc"}}})
    os.utime(terraform, (1_000_000, 1_000_000))
    assert job_id_from_local_state(tmp_path, "dev", "train") == (42, direct)
    os.utime(direct, (900_000, 900_000))
    assert job_id_from_local_state(tmp_path, "dev", "train") == (41, terraform)


def test_unreadable_or_unfamiliar_state_files_are_passed_over(tmp_path):
    folder = tmp_path / ".databricks" / "bundle" / "dev"
    (folder / "terraform").mkdir(parents=True)
    (folder / "terraform" / "terraform.tfstate").write_text("{ not json")
    _write(folder / "resources.json", {"deployment_id": "d-1"})  # state kept in the workspace, not here
    assert job_id_from_local_state(tmp_path, "dev", "train") is None


def test_an_unreadable_databricks_yml_says_why(tmp_path):
    (tmp_path / "databricks.yml").write_text("bundle: [name: x\n")
    with pytest.raises(DeploymentError, match="no bundle.name in .*databricks.yml: "):
        read_bundle_target(tmp_path, None)
