"""compute/versions.yaml against the Databricks CLI's bundle JSON schema (`databricks bundle schema`, v1.13.0 here):
a name the CLI no longer knows, or one it knows and the file lacks, fails here rather than at deploy.

Needs the schema: set DATABRICKS_BUNDLE_SCHEMA to its path (the output of `databricks bundle schema`).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

import pytest

from distributed_training.compute.runtime import versions
from distributed_training.tooling.bundle.schema import SCHEMA_ENV

SCHEMA = os.environ.get(SCHEMA_ENV)
pytestmark = pytest.mark.skipif(not SCHEMA, reason=f"set {SCHEMA_ENV} to the bundle JSON schema file")
SDK = "github.com/databricks/databricks-sdk-go/service/"
# local code_source_path folders packaged at deploy (the Databricks CLI's CHANGELOG, v1.11.0); ai_runtime_task and
# `bundle validate --strict` came earlier
LOCAL_CODE_SOURCE_CLI = (1, 11, 0)


@lru_cache(maxsize=1)
def definitions() -> dict:
    return json.loads(Path(SCHEMA).read_text())["$defs"]


def definition(name: str) -> dict:
    """The schema's definition of an SDK type (`jobs.Task`): its first alternative, the one not a `${...}`."""
    node = definitions()
    for part in (SDK + name).split("/"):
        node = node[part]
    return node["oneOf"][0] if "oneOf" in node else node


def enum(name: str) -> set[str]:
    return set(definition(name)["enum"])


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).removeprefix("v").split("."))


def test_the_serverless_accelerators_are_exactly_the_schemas():
    assert set(versions()["serverless"]["accelerators"]) == enum("jobs.ComputeSpecAcceleratorType")
    assert versions()["serverless"]["default_accelerator"] in enum("jobs.ComputeSpecAcceleratorType")


def test_kind_and_access_modes_are_the_schemas():
    assert versions()["kind"] in enum("compute.Kind")
    modes = versions()["access_modes"]
    assert set(modes) == {"dedicated", "standard"}
    assert set(modes.values()) <= enum("compute.DataSecurityMode")


def test_the_generated_cluster_fields_exist_in_the_schema():
    """kind, use_ml_runtime and is_single_node: the form Databricks' docs show (CLASSIC_PREVIEW)."""
    fields = definition("compute.ClusterSpec")["properties"]
    assert {"kind", "use_ml_runtime", "is_single_node", "data_security_mode", "spark_version"} <= set(fields)


def test_the_cli_version_is_new_enough_for_what_the_project_uses():
    cli, minimum = version(versions()["databricks_cli"]), version(versions()["minimum_databricks_cli"])
    assert cli >= minimum >= LOCAL_CODE_SOURCE_CLI


def test_the_schema_has_ai_runtime_task_with_a_code_source_path():
    """ai_runtime_task (CLI v1.5+/v1.6+) with code_source_path, and its deployments' command_path and compute."""
    task = definition("jobs.Task")["properties"]
    assert task["ai_runtime_task"]["$ref"].endswith("jobs.AiRuntimeTask")
    ai_runtime = definition("jobs.AiRuntimeTask")
    assert {"code_source_path", "deployments", "experiment"} <= set(ai_runtime["properties"])
    assert {"experiment", "deployments"} <= set(ai_runtime.get("required", []))
    deployment = definition("jobs.DeploymentSpec")["properties"]
    assert {"command_path", "compute"} <= set(deployment)
