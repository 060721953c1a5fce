"""The template rendered through cookiecutter: every answer combination gives a bundle that validates."""

from __future__ import annotations

import re

import pytest
import yaml
from cookiecutter.exceptions import FailedHookException

from distributed_training.bundle.validate import validate_bundle
from distributed_training.compute.engines import ENGINES

CLOUDS = ("azure", "aws", "gcp")
# A Jinja marker left behind; `{{job.…}}` (Databricks dynamic values) and `${{ … }}` (GitHub expressions) are meant.
LEFTOVER_JINJA = re.compile(r"\{%|\{#|(?<!\$)\{\{(?!job\.)")


def errors_of(project, schema=None, targets=("dev", "prod")):
    findings = validate_bundle(project, targets=list(targets), schema_path=schema)
    return [str(finding) for per_target in findings.values() for finding in per_target if finding.is_error]


def job_files(project):
    return sorted(path.name for path in (project / "resources").glob("*.job.yml"))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("engine", [*ENGINES, "all"])
@pytest.mark.parametrize("cloud", CLOUDS)
def test_every_combination_renders_and_validates(render, bundle_schema, cloud, engine, num_workers):
    project = render(cloud=cloud, engine=engine, num_workers=num_workers)

    assert errors_of(project, bundle_schema) == []
    expected_engines = ENGINES if engine == "all" else (engine,)
    assert job_files(project) == sorted(f"train_{name}.job.yml" for name in expected_engines)
    for path in project.rglob("*"):
        if path.is_file() and path.suffix in {".yml", ".yaml", ".py", ".toml", ".md", ".json"}:
            leftover = LEFTOVER_JINJA.search(path.read_text())
            assert leftover is None, f"{path.relative_to(project)} keeps a Jinja marker: {leftover.group()!r}"


def test_default_answers_give_a_single_gpu_node_with_one_process_per_gpu(render):
    project = render()
    job = yaml.safe_load((project / "resources" / "train_torch_distributor.job.yml").read_text())
    job = job["resources"]["jobs"]["train_torch_distributor"]
    cluster = job["job_clusters"][0]["new_cluster"]
    assert cluster["node_type_id"] == "Standard_NC64as_T4_v3"
    assert cluster["num_workers"] == 0
    assert cluster["spark_conf"]["spark.databricks.cluster.profile"] == "singleNode"
    assert cluster["custom_tags"] == {"ResourceClass": "SingleNode"}
    assert cluster["data_security_mode"] == "SINGLE_USER"
    parameters = job["tasks"][0]["python_wheel_task"]["parameters"]
    assert parameters[parameters.index("--gpus-per-node") + 1] == "4"
    assert parameters[parameters.index("--num-nodes") + 1] == "1"
    assert (project / "src" / "my_training" / "compute" / "node_types.yaml").is_file()


def test_multi_node_gpu_cluster_schedules_one_process_per_gpu(render):
    project = render(cloud="aws", engine="all", num_workers=2)
    jobs = {}
    for path in (project / "resources").glob("*.job.yml"):
        jobs.update(yaml.safe_load(path.read_text())["resources"]["jobs"])
    amounts = {key: job["job_clusters"][0]["new_cluster"].get("spark_conf", {}).get("spark.task.resource.gpu.amount")
               for key, job in jobs.items()}
    assert amounts == {"train_torch_distributor": "1", "train_deepspeed": "1", "train_ray": "0",
                       "train_spark_ml_connect": None}
    spark_ml = jobs["train_spark_ml_connect"]["job_clusters"][0]["new_cluster"]
    assert (spark_ml["node_type_id"], spark_ml["data_security_mode"]) == ("m5d.2xlarge", "USER_ISOLATION")


def test_azure_nc_series_multi_node_is_refused_and_nothing_is_written(render, tmp_path, capfd):
    with pytest.raises(FailedHookException):
        render(tmp_path, cloud="azure", node_type_id="Standard_NC24s_v3", num_workers=2)
    assert list(tmp_path.iterdir()) == []
    stderr = capfd.readouterr().err
    assert "[azure-nc-multi-node]" in stderr
    assert "Standard_NC64as_T4_v3" in stderr  # the fix names an accelerated-networking size


def test_accelerated_networking_size_may_go_multi_node(render, bundle_schema):
    project = render(cloud="azure", node_type_id="Standard_NC64as_T4_v3", num_workers=2)
    assert errors_of(project, bundle_schema) == []


@pytest.mark.parametrize("answers, rule", [
    ({"project_slug": "My Project!"}, "invalid-project-slug"),
    ({"package_name": "class"}, "invalid-package-name"),
    ({"package_name": "torch"}, "reserved-package-name"),
    ({"num_workers": "two"}, "invalid-num-workers"),
    ({"num_workers": "-1"}, "invalid-num-workers"),
    ({"catalog": "main; DROP TABLE x"}, "invalid-catalog"),
    ({"node_type_id": "Standard_NC64as_T4_v4"}, "unknown-node-type"),
    ({"cloud": "aws", "node_type_id": "Standard_NC64as_T4_v3"}, "node-type-wrong-cloud"),
    ({"spark_version": "17.3.x-cpu-ml-scala2.13"}, "gpu-node-cpu-runtime"),
    ({"spark_version": "12.2.x-gpu-ml-scala2.12"}, "runtime-too-old"),
    ({"engine": "spark_ml_connect", "spark_version": "16.4.x-scala2.12"}, "runtime-too-old"),
    ({"engine": "deepspeed", "node_type_id": "Standard_D8ds_v5", "spark_version": "17.3.x-cpu-ml-scala2.13"},
     "engine-needs-gpu"),
])
def test_bad_answers_are_refused_with_the_rule_and_nothing_is_written(render, tmp_path, capfd, answers, rule):
    with pytest.raises(FailedHookException):
        render(tmp_path, **answers)
    assert list(tmp_path.iterdir()) == []
    assert f"[{rule}]" in capfd.readouterr().err


def test_unknown_node_type_passes_when_allowed_and_the_choice_is_recorded(render, bundle_schema):
    project = render(node_type_id="Standard_NC64as_T4_v9", allow_unknown_node_type="yes")
    job = yaml.safe_load((project / "resources" / "train_torch_distributor.job.yml").read_text())
    cluster = job["resources"]["jobs"]["train_torch_distributor"]["job_clusters"][0]["new_cluster"]
    assert cluster["custom_tags"]["allow_unknown_node_type"] == "true"
    assert errors_of(project, bundle_schema) == []
