"""The template rendered through cookiecutter: every answer combination gives a bundle that validates.

Every cloud x engine (all included) x single node or two workers with the default task, and every engine with the
other task; the clusters in the form Databricks' docs show now (`kind: CLASSIC_PREVIEW`, `use_ml_runtime`,
`is_single_node`); bad answers refused with the rule and nothing written (the full matrix: tests/failures/).
"""

from __future__ import annotations

import re
import sys

from pathlib import Path

import pytest
import yaml
from cookiecutter.exceptions import FailedHookException

from distributed_training.compute.catalog import CLOUDS, default_catalog
from distributed_training.compute.preflight import EXECUTOR_GPUS_CONF, ObservedCluster, TrainingRequest, check
from distributed_training.compute.requirements import ENGINES, SPARK_ML_CONNECT
from distributed_training.compute.runtime import versions
from distributed_training.tooling.bundle.validate import validate_bundle

# A Jinja marker left behind; `{{job.…}}` (Databricks dynamic values) and `${{ … }}` (GitHub expressions) are meant.
LEFTOVER_JINJA = re.compile(r"\{%|\{#|(?<!\$)\{\{(?!job\.)|cookiecutter\.")
RUNTIME, KIND = versions()["runtime"], versions()["kind"]
REPOSITORY = Path(__file__).resolve().parents[2]
DEDICATED, STANDARD = versions()["access_modes"]["dedicated"], versions()["access_modes"]["standard"]


def errors_of(project, schema=None, targets=("dev", "prod")):
    findings = validate_bundle(project, targets=list(targets), schema_path=schema)
    return [f"{target}: {finding}" for target, per_target in findings.items() for finding in per_target
            if finding.is_error]


def jobs_of(project) -> dict:
    jobs = {}
    for path in (project / "resources").glob("*.job.yml"):
        jobs.update(yaml.safe_load(path.read_text())["resources"]["jobs"])
    return jobs


def cluster_of(job) -> dict:
    [job_cluster] = job["job_clusters"]
    return job_cluster["new_cluster"]


def option(parameters, name):
    return parameters[parameters.index(name) + 1]


def assert_rendered_for(project, engines, task):
    """Job files and notebooks for exactly the chosen engines, the chosen task carried, no Jinja left anywhere."""
    assert sorted(path.name for path in (project / "resources").glob("*.job.yml")) == sorted(
        ["score.job.yml", *(f"train_{engine}.job.yml" for engine in engines)])
    assert sorted(path.name for path in (project / "notebooks").glob("*.py")) == sorted(
        f"train_{engine}.py" for engine in engines)
    assert sorted(jobs_of(project)) == sorted(["score", *(f"train_{engine}" for engine in engines)])
    package = project / "src" / "my_training"
    assert sorted(path.stem for path in (package / "engines").glob("*.py")
                  if path.stem in ENGINES) == sorted(engines)
    assert (package / "task.py").read_bytes() == (REPOSITORY / "src" / "distributed_training" / "tasks" /
                                                  f"{task}.py").read_bytes()
    variables = yaml.safe_load((project / "databricks.yml").read_text())["variables"]
    # Empty: the task's own DEFAULT_TABLE (Spark ML's: the taxi trips), so that replacing task.py changes nothing else
    tables = {name: variables[name]["default"] for name in ("training_table", "spark_ml_table") if name in variables}
    assert tables == {**({"training_table": ""} if set(engines) - {SPARK_ML_CONNECT} else {}),
                      **({"spark_ml_table": ""} if SPARK_ML_CONNECT in engines else {})}
    for path in project.rglob("*"):
        if path.is_file() and path.suffix in {".yml", ".yaml", ".py", ".toml", ".md", ".json", ".sh", ".cfg"}:
            leftover = LEFTOVER_JINJA.search(path.read_text())
            assert leftover is None, f"{path.relative_to(project)} keeps a Jinja marker: {leftover.group()!r}"


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("engine", [*ENGINES, "all"])
@pytest.mark.parametrize("cloud", CLOUDS)
def test_every_combination_renders_and_validates(rendered, bundle_schema, cloud, engine, num_workers):
    project = rendered(cloud=cloud, engine=engine, num_workers=num_workers)

    assert errors_of(project, bundle_schema) == []
    engines = ENGINES if engine == "all" else (engine,)
    assert_rendered_for(project, engines, "fare_regression")
    for key, job in jobs_of(project).items():
        cluster = cluster_of(job)
        assert (cluster["kind"], cluster["spark_version"]) == (KIND, RUNTIME), key
        if num_workers:
            assert cluster["num_workers"] == num_workers and "is_single_node" not in cluster, key
        else:
            assert cluster["is_single_node"] is True and "num_workers" not in cluster, key
        parameters = job["tasks"][0]["python_wheel_task"]["parameters"]
        if key == "score":  # the cluster of the first chosen engine that trains a torch model, else Spark ML's, with
            # a GPU to each Spark task on several GPU nodes (tests/template/test_score_job.py)
            trainer = next((name for name in engines if name != SPARK_ML_CONNECT), SPARK_ML_CONNECT)
            without_conf = lambda cluster: {**cluster, "spark_conf": None}  # noqa: E731
            assert without_conf(cluster) == without_conf(cluster_of(jobs_of(project)[f"train_{trainer}"]))
            continue
        if key != f"train_{SPARK_ML_CONNECT}":
            assert cluster["use_ml_runtime"] is True and cluster["data_security_mode"] == DEDICATED, key
            assert option(parameters, "--num-nodes") == str(max(num_workers, 1))
            assert option(parameters, "--gpus-per-node") == str(default_catalog().find(cluster["node_type_id"]).gpus)


@pytest.mark.parametrize("engine", [*ENGINES, "all"])
def test_the_language_model_task_renders_and_validates_for_every_engine(rendered, bundle_schema, engine):
    project = rendered(task="causal_lm", engine=engine)
    assert errors_of(project, bundle_schema) == []
    engines = ENGINES if engine == "all" else (engine,)
    assert_rendered_for(project, engines, "causal_lm")
    for key, job in jobs_of(project).items():
        parameters = job["tasks"][0]["python_wheel_task"]["parameters"]
        assert "--model-size" not in parameters  # no option of the task: the jobs train task.py's defaults
        if key == "score":  # the table the run trained on, unless the job run's parameter names another
            assert option(parameters, "--table") == "{{job.parameters.table}}"
        elif key == f"train_{SPARK_ML_CONNECT}":  # Spark ML trains its own pipeline on its own table, not the task
            assert option(parameters, "--table") == "${var.spark_ml_table}"
        else:
            assert option(parameters, "--table") == "${var.training_table}"


@pytest.mark.parametrize("answers", [{"engine": "deepspeed"}, {"engine": "all"},
                                     {"compute": "serverless_gpu", "engine": "torch_distributor"}],
                         ids=lambda answers: "-".join(answers.values()))
def test_the_fine_tuning_task_renders_and_validates_and_its_jobs_take_the_base_model_from_a_variable(
        rendered, bundle_schema, monkeypatch, answers):
    """Every job that trains the task passes --base-model ${var.base_model} (the stage task of a serverless job too),
    Spark ML's job its own pipeline as ever; the variable is empty until the user sets it, which `validate` names,
    once a job in each target, and no longer once set (here, as BUNDLE_VAR_base_model would set it at deploy)."""
    project = rendered(task="fine_tune", **answers)
    assert errors_of(project, bundle_schema) == []
    serverless = answers.get("compute") == "serverless_gpu"
    engines = ENGINES if answers["engine"] == "all" else (answers["engine"],)
    if not serverless:
        assert_rendered_for(project, engines, "fine_tune")
    variable = yaml.safe_load((project / "databricks.yml").read_text())["variables"]["base_model"]
    assert variable["default"] == "" and "/Volumes/<catalog>/<schema>/<volume>/<model>" in variable["description"]
    trainers = set()
    for key, job in jobs_of(project).items():
        parameters = job["tasks"][0]["python_wheel_task"]["parameters"]
        if key in ("score", f"train_{SPARK_ML_CONNECT}"):  # score: the run's own options; Spark ML: no task
            assert "--base-model" not in parameters, key
        else:
            assert option(parameters, "--base-model") == "${var.base_model}", key
            trainers.add(key)
    assert trainers == {f"train_{engine}" for engine in engines if engine != SPARK_ML_CONNECT}
    findings = validate_bundle(project, targets=["dev", "prod"], schema_path=bundle_schema)
    empty = {(target, finding.path.split(".")[2]) for target, per_target in findings.items() for finding in per_target
             if finding.rule == "empty-base-model"}
    assert empty == {(target, key) for target in ("dev", "prod") for key in trainers}
    warning = next(finding for finding in findings["dev"] if finding.rule == "empty-base-model")
    assert not warning.is_error and "targets.dev.variables.base_model: /Volumes/" in warning.fix
    monkeypatch.setenv("BUNDLE_VAR_base_model", "/Volumes/main/default/models/Llama-3.2-1B")
    assert [finding for per_target in validate_bundle(project, targets=["dev", "prod"]).values()
            for finding in per_target if finding.rule == "empty-base-model"] == []


def test_default_answers_give_one_multi_gpu_node_with_one_process_per_gpu(rendered):
    project = rendered()
    jobs = jobs_of(project)
    assert sorted(jobs) == ["score", "train_torch_distributor"]
    assert cluster_of(jobs["score"]) == cluster_of(jobs["train_torch_distributor"])  # it scores on the GPUs too
    job = jobs["train_torch_distributor"]
    assert cluster_of(job) == {
        "kind": "CLASSIC_PREVIEW", "spark_version": "17.3.x-scala2.13", "node_type_id": "Standard_NC64as_T4_v3",
        "use_ml_runtime": True, "is_single_node": True, "data_security_mode": "DATA_SECURITY_MODE_DEDICATED",
        "runtime_engine": "STANDARD", "azure_attributes": {"availability": "ON_DEMAND_AZURE"}}
    [task] = job["tasks"]
    assert (task["python_wheel_task"]["package_name"], task["python_wheel_task"]["entry_point"]) == (
        "my_training", "train")
    parameters = task["python_wheel_task"]["parameters"]
    assert (option(parameters, "--gpus-per-node"), option(parameters, "--num-nodes")) == ("4", "1")
    assert option(parameters, "--engine") == "torch_distributor"
    assert task["libraries"] == [{"whl": "../dist/*.whl"}]
    assert (project / "src" / "my_training" / "compute" / "node_types.yaml").is_file()
    assert not (project / "src" / "command.sh").exists()  # the serverless GPU task's script only


def test_multi_node_gpu_clusters_schedule_one_process_per_gpu_and_spark_ml_gets_a_cpu_cluster(rendered):
    project = rendered(cloud="aws", engine="all", num_workers=2)
    jobs = jobs_of(project)
    amounts = {key: cluster_of(job).get("spark_conf", {}).get("spark.task.resource.gpu.amount")
               for key, job in jobs.items()}
    assert amounts == {"train_torch_distributor": "1", "train_deepspeed": "1", "train_ray": "0",
                       "train_spark_ml_connect": None, "score": "1"}  # score: a GPU to each of its Spark tasks
    spark_ml = cluster_of(jobs["train_spark_ml_connect"])
    assert (spark_ml["node_type_id"], spark_ml["data_security_mode"], spark_ml["num_workers"]) == (
        "m5d.2xlarge", STANDARD, 2)
    assert "use_ml_runtime" not in spark_ml and spark_ml["spark_version"] == RUNTIME
    for key in ("train_torch_distributor", "train_deepspeed", "train_ray"):
        assert cluster_of(jobs[key])["node_type_id"] == "g5.12xlarge", key
    assert option(jobs["train_spark_ml_connect"]["tasks"][0]["python_wheel_task"]["parameters"],
                  "--spark-ml-api") == "classic"


def test_a_single_node_gpu_cluster_sets_no_gpu_scheduling(rendered):
    """One node: the distributor starts its processes on the driver; spark_conf is for executors' tasks."""
    for job in jobs_of(rendered(engine="all")).values():
        assert "spark_conf" not in cluster_of(job)


def test_a_retired_nc_series_node_is_refused_with_current_sizes_and_nothing_is_written(render, tmp_path, capfd):
    """The NC-series that Databricks advised against for multi-node training is retired: refused either way."""
    with pytest.raises(FailedHookException):
        render(tmp_path, cloud="azure", node_type_id="Standard_NC24s_v3", num_workers=2)
    assert list(tmp_path.iterdir()) == []
    stderr = capfd.readouterr().err
    assert "[retired-node-type]" in stderr
    assert "Standard_NC64as_T4_v3" in stderr  # the fix names a current size with accelerated networking


def test_accelerated_networking_size_may_go_multi_node(rendered, bundle_schema):
    project = rendered(cloud="azure", node_type_id="Standard_NC64as_T4_v3", num_workers=2)
    assert errors_of(project, bundle_schema) == []


@pytest.mark.parametrize("answers, rule", [
    ({"project_slug": "My Project!"}, "invalid-project-slug"),
    ({"package_name": "torch"}, "reserved-package-name"),
    ({"num_workers": "two"}, "invalid-num-workers"),
    ({"catalog": "main; DROP TABLE x"}, "invalid-catalog"),
    ({"node_type_id": "Standard_NC64as_T4_v4"}, "unknown-node-type"),
    ({"cloud": "aws", "node_type_id": "Standard_NC64as_T4_v3"}, "node-type-wrong-cloud"),
    ({"spark_version": "12.2.x-gpu-ml-scala2.12"}, "runtime-too-old"),
    ({"engine": "deepspeed", "node_type_id": "Standard_D8ds_v5"}, "engine-needs-gpu"),
])
def test_bad_answers_are_refused_with_the_rule_and_nothing_is_written(render, tmp_path, capfd, answers, rule):
    with pytest.raises(FailedHookException):
        render(tmp_path, **answers)
    assert list(tmp_path.iterdir()) == []
    stderr = capfd.readouterr().err
    assert f"[{rule}]" in stderr and "Nothing was generated" in stderr, stderr


def test_unknown_node_type_passes_when_allowed_and_the_choice_is_recorded(rendered, bundle_schema):
    project = rendered(node_type_id="Standard_NC64as_T4_v9", allow_unknown_node_type="yes")
    cluster = cluster_of(jobs_of(project)["train_torch_distributor"])
    assert cluster["custom_tags"]["allow_unknown_node_type"] == "true"
    assert errors_of(project, bundle_schema) == []


@pytest.mark.parametrize("answers", [{}, {"compute": "serverless_gpu"}], ids=["classic", "serverless"])
def test_the_bundle_states_the_oldest_cli_that_deploys_it(rendered, answers):
    """A local code_source_path is packaged at deploy from CLI v1.11.0 on (bundle/config/mutator/aicode): an older CLI
    stops at `bundle.databricks_cli_version` instead of deploying a job that cannot start."""
    bundle = yaml.safe_load((rendered(**answers) / "databricks.yml").read_text())["bundle"]
    assert bundle["databricks_cli_version"] == f">= {versions()['minimum_databricks_cli']}"


def test_the_readme_installs_the_tool_that_builds_the_bundles_wheel(rendered):
    """`databricks bundle deploy` runs the artifact's build command on the deploying machine."""
    project = rendered()
    tool = yaml.safe_load((project / "databricks.yml").read_text())["artifacts"]["default"]["build"].split()[0]
    deploy = (project / "README.md").read_text().split("## Deploy and run", 1)[1]
    assert deploy.index(f"pip install {tool}") < deploy.index("databricks bundle deploy")


def test_a_multi_node_job_names_its_coordinating_driver(rendered):
    """TorchDistributor's local_mode=False trains on the workers; the driver, a smaller GPU node, coordinates."""
    job = (rendered(cloud="aws", num_workers=2) / "resources" / "train_torch_distributor.job.yml").read_text()
    assert "2 worker nodes train; the driver only coordinates" in job
    assert "It is a g5.xlarge, the smallest GPU size of the workers' family" in job and "advise" in job
    only_size = (rendered(cloud="aws", num_workers=2, node_type_id="p4d.24xlarge") / "resources" /
                 "train_torch_distributor.job.yml").read_text()
    assert "It is one more p4d.24xlarge, the only size of its family" in only_size
    assert "the driver only coordinates" not in (rendered() / "resources" / "train_torch_distributor.job.yml"
                                                 ).read_text()


@pytest.mark.parametrize("engine", ["torch_distributor", "deepspeed", "ray"])
def test_a_one_worker_project_trains_on_its_worker_and_passes_the_preflight(rendered, engine):
    """num_workers=1: the job asks for `--num-nodes 1` of the worker's GPUs beside a coordinating 1-GPU driver. As
    Databricks shows that cluster to the preflight (its usage tags; spark.executor.resource.gpu.amount, a worker's
    GPUs), the request passes: the ranks run on the worker's executor, whose GPUs count, not the driver's."""
    project = rendered(cloud="aws", engine=engine, num_workers=1)
    job = jobs_of(project)[f"train_{engine}"]
    cluster, parameters = cluster_of(job), job["tasks"][0]["python_wheel_task"]["parameters"]
    assert "One worker node trains; the driver only coordinates" in (
        project / "resources" / f"train_{engine}.job.yml").read_text()
    catalog = default_catalog()
    driver, worker = catalog.find(cluster["driver_node_type_id"]), catalog.find(cluster["node_type_id"])
    request = TrainingRequest(engine, *(int(option(parameters, name)) for name in ("--num-nodes", "--gpus-per-node")))
    assert (request.num_nodes, request.gpus_per_node, driver.gpus) == (1, worker.gpus, 1) and worker.gpus > 1
    observed = ObservedCluster("spark://10.0.0.1:7077", driver.gpus, cluster["num_workers"],
                               {**cluster.get("spark_conf", {}), EXECUTOR_GPUS_CONF: str(worker.gpus)},
                               node_type_id=worker.id, spark_version=cluster["spark_version"],
                               driver_node_type_id=driver.id)
    assert [str(finding) for finding in check(request, observed) if finding.is_error] == []
    assert observed.trains_on_workers


@pytest.mark.parametrize("answers, workers, driver", [
    ({"cloud": "aws", "engine": "all", "num_workers": 2}, "g5.12xlarge", "g5.xlarge"),
    ({"engine": "all", "num_workers": 2}, "Standard_NC64as_T4_v3", "Standard_NC4as_T4_v3"),
    ({"cloud": "gcp", "engine": "ray", "num_workers": 2, "node_type_id": "a2-highgpu-8g"}, "a2-highgpu-8g",
     "a2-highgpu-1g"),
    ({"cloud": "aws", "num_workers": 2, "node_type_id": "p4d.24xlarge"}, "p4d.24xlarge", None),
], ids=["aws-g5", "azure-t4", "gcp-a100-ray", "aws-p4d-one-size"])
def test_multi_node_gpu_clusters_take_the_smallest_gpu_size_of_the_workers_family_as_driver(
        rendered, bundle_schema, answers, workers, driver):
    """With workers no engine trains on the driver (TorchDistributor and DeepSpeed run local_mode=False, Ray on
    Spark's head node has no GPU for tasks: ray.util.spark setup_ray_cluster's num_gpus_head_node defaults to 0 off
    global mode). Databricks docs "GPU-enabled compute": the driver and worker types must be GPU instance types; of the
    workers' GPU model, so that precision (launch.py, the driver's GPU) is the workers'. Spark ML's CPU cluster and
    single nodes keep the default (the driver is of the workers' type)."""
    project = rendered(**answers)
    catalog = default_catalog()
    for key, job in jobs_of(project).items():
        cluster = cluster_of(job)
        if key == "train_spark_ml_connect":
            assert "driver_node_type_id" not in cluster
            continue
        assert cluster["node_type_id"] == workers, key
        assert cluster.get("driver_node_type_id") == driver, key
        if driver:
            smaller, larger = catalog.find(driver), catalog.find(workers)
            assert (smaller.family, smaller.gpu_model) == (larger.family, larger.gpu_model)
            assert smaller.gpus < larger.gpus or smaller.vcpus < larger.vcpus
    assert errors_of(project, bundle_schema) == []
    assert "driver_node_type_id" not in cluster_of(jobs_of(rendered(engine="all"))["train_ray"])  # one node


@pytest.mark.parametrize("answers", [{}, {"compute": "serverless_gpu"}], ids=["classic", "serverless"])
def test_the_wheel_gets_a_version_of_its_own_at_each_deploy(rendered, bundle_schema, answers):
    """`dynamic_version` (CLI bundle/config/artifact.go:48) patches each build's wheel to 0.1.0+<its mtime>
    (libs/patchwheel/parse.go:24) and points the jobs' libraries and environments at it
    (bundle/libraries/switch_to_patched_wheels.go): a redeployed wheel of an unchanged name was served stale
    (databricks/cli#1621). The offline validate and the CLI's schema take the field."""
    project = rendered(**answers)
    artifact = yaml.safe_load((project / "databricks.yml").read_text())["artifacts"]["default"]
    assert (artifact["type"], artifact["build"], artifact["dynamic_version"]) == ("whl", "uv build --wheel", True)
    findings = validate_bundle(project, targets=["dev", "prod"], schema_path=bundle_schema)
    assert [str(finding) for per_target in findings.values() for finding in per_target
            if finding.is_error or "artifacts" in (finding.path or "")] == []


EXAMPLES = {"fare_regression": "trip_classifier", "causal_lm": "recurrent_language_model",
            "fine_tune": "recurrent_language_model"}


@pytest.mark.parametrize("task", list(EXAMPLES))
def test_each_task_s_project_brings_an_example_of_its_own_kind(rendered, spark, monkeypatch, task):
    """The bring-your-own-model example, the README's words and the generated test that trains it follow the task:
    a language model's project gets a language model, named in the README and its test, and no word of taxis."""
    import numpy as np
    import pyarrow as pa
    import torch

    from distributed_training.task_interface import check_metrics, load_task

    project = rendered(task=task)
    example = EXAMPLES[task]
    assert [path.name for path in (project / "examples").iterdir()] == [f"{example}.py"]
    readme = (project / "README.md").read_text()
    section = readme[readme.index("## Bring your own model"):readme.index("## Deploy and run")]
    assert f"--task examples.{example}" in section and f"cp examples/{example}.py src/my_training/task.py" in section
    assert f"examples.{example}" in (project / "tests" / "test_bring_your_own_model.py").read_text()
    if task != "fare_regression":
        assert not re.search(r"fare|taxi|trip", readme, re.IGNORECASE)
    monkeypatch.syspath_prepend(str(project))  # as the README runs it: PYTHONPATH=. --task examples.<example>
    monkeypatch.delitem(sys.modules, "examples", raising=False)
    own = load_task(f"examples.{example}")
    options = own.Options()
    prepared = own.prepare(own.sample_table(spark, seed=1), options).limit(200)
    stats = own.statistics(prepared, options)
    rows = pa.Table.from_pandas(prepared.toPandas(), preserve_index=False)
    batch = own.examples(own.tokenize(rows.to_pandas(), options) if hasattr(own, "tokenize") else rows, stats,
                         options)
    model = own.build_model(stats, options)
    assert torch.isfinite(own.loss(model, batch))
    metrics = check_metrics(own.summarize(own.evaluate(model, batch, stats), stats), example)
    exported, example_input = own.exported_model(model, stats, batch)
    assert np.isfinite(metrics["held_out_loss"]) and exported(torch.from_numpy(example_input)) is not None
