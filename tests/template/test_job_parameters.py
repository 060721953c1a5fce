"""Every generated job passes parameters that its project's `train` accepts, and every notebook runs what its job
runs: template and runtime cannot drift.

The generated package is not importable here, so the lists are parsed with this repository's `config` (the runtime
the project carries byte for byte, test_generated_package.py), the project's task named by --task and the engines
limited to those the project carries, as its `train` (launch.main) would limit them.
"""

from __future__ import annotations

import ast
import re

import pytest
import yaml

from distributed_training import config as configuration
from distributed_training.compute.catalog import default_catalog
from distributed_training.tooling.serverless import ACCELERATORS

ROOT_PATH = "/Workspace/Users/me@example.com/.bundle/my-training/dev"
VOLUME = "/Volumes/main/default/dev_me_my_training_training"
# Deploy-time values, as the CLI and the Jobs service would fill them in.
JOB_RUN = "550315892394120"
BASE_MODEL = "/Volumes/main/default/models/Llama-3.2-1B"  # what a target gives the fine-tuning jobs' variable
DEPLOYED = {"${var.catalog}": "main", "${var.schema}": "default", "${var.base_model}": BASE_MODEL,
            "${resources.volumes.training.name}": "dev_me_my_training_training", "{{job.parameters.epochs}}": "5",
            "${var.scores_table}": "dev_me_my_training_scores",
            "${workspace.root_path}": ROOT_PATH, "{{job.run_id}}": JOB_RUN}
TASKS = ("fare_regression", "causal_lm")
# What a notebook asks for in widgets instead of the job's deploy-time values (each, in the notebook's source).
WIDGETS = {"${var.training_table}": "dbutils.widgets.get('table')",
           "${var.spark_ml_table}": "dbutils.widgets.get('table')",
           "{{job.parameters.epochs}}": "dbutils.widgets.get('epochs')",
           "${var.base_model}": "dbutils.widgets.get('base_model')"}
PLATFORM_ONLY = ("--job-run-id", "{{job.run_id}}")  # a notebook run is no job run
RENDERS = [
    *({"cloud": "aws", "engine": "all", "num_workers": workers, "task": task} for workers in (0, 2) for task in TASKS),
    *({"compute": "serverless_gpu", "engine": engine, "accelerator_type": "GPU_8xH100", "accelerator_count": count,
       "task": task} for engine, count in (("torch_distributor", 8), ("deepspeed", 16)) for task in TASKS),
    # fine_tune adds an option to the jobs (--base-model), the same on every engine: one render of each compute
    {"cloud": "aws", "engine": "all", "num_workers": 0, "task": "fine_tune"},
    {"compute": "serverless_gpu", "engine": "torch_distributor", "accelerator_type": "GPU_8xH100",
     "accelerator_count": 8, "task": "fine_tune"},
]


def deployed(parameter: str, table: str) -> str:
    for reference, value in {**DEPLOYED, "${var.training_table}": table, "${var.spark_ml_table}": ""}.items():
        parameter = parameter.replace(reference, value)
    assert not re.search(r"\$\{|\{\{", parameter), f"{parameter}: a reference this test does not know"
    return parameter


def carried_engines(project) -> tuple[str, ...]:
    present = {path.stem for path in (project / "src" / "my_training" / "engines").glob("*.py")}
    return tuple(engine for engine in configuration.ENGINES if engine in present)


def wheel_tasks(project):
    """(job key, job, task) of every python_wheel_task of the project's training jobs."""
    for path in sorted((project / "resources").glob("train_*.job.yml")):
        for key, job in yaml.safe_load(path.read_text())["resources"]["jobs"].items():
            for task in job["tasks"]:
                if "python_wheel_task" in task:
                    yield key, job, task


@pytest.mark.parametrize("answers", RENDERS, ids=lambda answers: "-".join(map(str, answers.values())))
def test_every_job_parameter_list_is_accepted_by_the_projects_train(rendered, answers):
    project = rendered(**answers)
    task_name, serverless = answers["task"], answers.get("compute") == "serverless_gpu"
    table = yaml.safe_load((project / "databricks.yml").read_text())["variables"]["training_table"]["default"]
    assert table == ""  # the task's own DEFAULT_TABLE: replacing task.py changes the table with it
    engines = carried_engines(project)
    seen = set()
    for key, job, task in wheel_tasks(project):
        wheel_task = task["python_wheel_task"]
        assert (wheel_task["entry_point"], wheel_task["package_name"]) == ("train", "my_training")
        argv = [deployed(parameter, table) for parameter in wheel_task["parameters"]]
        assert "--task" not in argv  # the project trains its own task.py
        config = configuration.from_args([*argv, "--task", f"distributed_training.tasks.{task_name}"], engines)
        configuration.check(config)
        engine = key.removeprefix("train_")
        seen.add(engine)
        assert config.engine == engine
        # Each job run its own folder, named by the platform's run id: a retry or repair keeps it, a new run not.
        assert (config.local, config.epochs, config.output_dir) == (False, 5, f"{VOLUME}/{engine}/{JOB_RUN}")
        assert config.job_run_id == JOB_RUN
        assert config.mlflow_experiment == f"{ROOT_PATH}/my-training-{engine}"
        if engine == "spark_ml_connect":
            # The Standard runtime has no torch for pyspark.ml.connect; Spark spreads over the executors itself.
            assert (config.spark_ml_api, config.table) == ("classic", None)
            continue
        assert config.table is None  # the task's DEFAULT_TABLE
        assert config.handoff_to_torchrun == serverless
        if serverless:
            assert task["task_key"] == "stage"
            per_node = ACCELERATORS[answers["accelerator_type"]].gpus_per_node
            assert (config.num_nodes, config.gpus_per_node) == (answers["accelerator_count"] // per_node, per_node)
        else:
            node_type = job["job_clusters"][0]["new_cluster"]["node_type_id"]
            assert config.num_nodes == max(answers["num_workers"], 1)
            assert config.gpus_per_node == default_catalog().find(node_type).gpus > 0
        # No option of the task but fine_tune's base model: the jobs train task.py's defaults, whatever task.py is.
        given = {"base_model": BASE_MODEL} if task_name == "fine_tune" else {}
        assert config.task_options == configuration.load_task(config.task).Options(**given)
    assert seen == set(engines)


@pytest.mark.parametrize("answers", [{"engine": "all", "num_workers": 2, "cloud": "aws"},
                                     {"engine": "all", "task": "causal_lm"}, {"engine": "all", "task": "fine_tune"}],
                         ids=lambda answers: "-".join(map(str, answers.values())))
def test_every_notebook_runs_its_jobs_arguments(rendered, answers):
    """The notebook's main([...]) is the job's list, except what a widget fills in (table, epochs), the output folder
    (a new one each run, beside the job runs', or the one to resume) and the experiment, as the job was deployed."""
    project = rendered(**answers)
    notebooks = set()
    for key, _, task in wheel_tasks(project):
        engine = key.removeprefix("train_")
        source = (project / "notebooks" / f"train_{engine}.py").read_text()
        notebooks.add(engine)
        [call] = [node for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "main"]
        [listed] = call.args
        arguments = [element.value if isinstance(element, ast.Constant) else ast.unparse(element)
                     for element in listed.elts]
        expected = [WIDGETS.get(value, value) for value in task["python_wheel_task"]["parameters"]
                    if value not in PLATFORM_ONLY]
        expected = ["output_dir" if value.startswith("/Volumes/") else
                    "experiment" if value.startswith("${workspace.root_path}/") else value for value in expected]
        assert arguments == expected, engine
        assert "from my_training.launch import main" in source
        assert 'dbutils.widgets.text("table", deployed["--table"],' in source  # the deployed job's table
        assert 'experiment = deployed["--mlflow-experiment"]' in source  # as the job was deployed (test_notebooks)
    assert notebooks == {path.stem.removeprefix("train_") for path in (project / "notebooks").glob("*.py")}


@pytest.mark.parametrize("answers", RENDERS[:2], ids=lambda answers: "-".join(map(str, answers.values())))
def test_the_score_jobs_parameters_are_accepted_by_the_projects_score(rendered, answers):
    """The run's folder from the job run's parameters (the training job run's id and its engine), or the model
    parameter where it is given (an MLflow model), the output table from the bundle's catalog and schema; an empty
    table parameter means the run's own."""
    from distributed_training import scoring

    project = rendered(**answers)
    [(key, job)] = yaml.safe_load((project / "resources" / "score.job.yml").read_text())["resources"]["jobs"].items()
    [task] = job["tasks"]
    assert (key, task["python_wheel_task"]["entry_point"]) == ("score", "score")
    parameters = {item["name"]: item["default"] for item in job["parameters"]}
    assert parameters == {"train_run_id": "", "engine": "torch_distributor", "model": "", "table": "",
                          "output_table": "${var.catalog}.${var.schema}.${var.scores_table}"}
    registered = "models:/main.default.fares@champion"
    for model, expected in (("", f"{VOLUME}/torch_distributor/{JOB_RUN}"), (registered, registered)):
        filled = {f"{{{{job.parameters.{name}}}}}": deployed(value or name.upper(), "") for name, value in
                  {**parameters, "train_run_id": JOB_RUN}.items()}
        filled["{{job.parameters.model}}"] = model
        argv = []
        for argument in task["python_wheel_task"]["parameters"]:
            for reference, value in filled.items():
                argument = argument.replace(reference, value)
            argv.append(deployed(argument, ""))
        arguments = scoring.parser().parse_args(argv)
        assert [given for given in arguments.model if given][-1] == expected  # as `parse` takes it
        assert (arguments.table, arguments.output_table) == ("TABLE", "main.default.dev_me_my_training_scores")
