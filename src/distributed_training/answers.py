"""The template's answers: the clusters they ask for, and every check made before a file is written."""

from __future__ import annotations

import importlib
import keyword
import re
from typing import Mapping

from . import serverless
from .bundle.clusters import request_from_cluster
from .clusters import default_spark_version, gpus_per_node, new_cluster
from .compute.catalog import CLOUDS, default_catalog
from .compute.guards import check_cluster
from .compute.requirements import ENGINES, SPARK_ML_CONNECT
from .compute.runtime import versions
from .findings import Finding

ALL_ENGINES = "all"
TASKS = ("fare_regression", "causal_lm")
SLUG = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
UC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
# Packages a generated project must not shadow: the runtime's own.
RESERVED_PACKAGES = {"pyspark", "torch", "deepspeed", "ray", "mlflow", "databricks", "numpy", "pandas", "test", "tests"}
YES_NO = ("yes", "no")
# The project name lands unquoted in YAML and inside TOML strings: words and a little punctuation, on one line, so no
# quote, backslash, colon or hash can end a string or start a mapping or a comment.
PROJECT_NAME = re.compile(r"[^\W_][\w .,'()&+-]{0,99}")


def chosen_engines(answers: Mapping) -> list[str]:
    return list(ENGINES) if answers["engine"] == ALL_ENGINES else [answers["engine"]]


def torch_engines(answers: Mapping) -> list[str]:
    """The chosen engines that run the task's training loop (Spark ML trains a pipeline of its own)."""
    return [engine for engine in chosen_engines(answers) if engine != SPARK_ML_CONNECT]


def default_node_type(cloud: str, engine: str) -> str:
    return default_catalog().default_node_type(cloud, gpu=engine != SPARK_ML_CONNECT).id


def default_cpu_node_type(cloud: str) -> str:
    return default_catalog().default_node_type(cloud, gpu=False).id


def job_cluster(answers: Mapping, engine: str) -> dict:
    """The `new_cluster` of one engine's job. With engine=all, Spark ML gets its own CPU cluster."""
    own_cpu_cluster = engine == SPARK_ML_CONNECT and answers["engine"] == ALL_ENGINES
    return new_cluster(
        engine=engine,
        cloud=answers["cloud"],
        node_type_id=answers["cpu_node_type_id"] if own_cpu_cluster else answers["node_type_id"],
        num_workers=int(answers["num_workers"]),
        spark_version=versions()["runtime"] if own_cpu_cluster else answers["spark_version"],
        allow_unknown_node_type=answers.get("allow_unknown_node_type") == "yes",
    )


# The job's values that a notebook asks for in widgets instead (see train_arguments).
TABLE, OUTPUT_DIR, EPOCHS, EXPERIMENT = "<table>", "<output_dir>", "<epochs>", "<experiment>"
TASK_ARGUMENTS = {"causal_lm": ["--model-size", "small"]}  # a GPU job trains more than the CPU tests' tiny model


def train_arguments(answers: Mapping, engine: str) -> list[str]:
    """The `train` command line of one engine's job, with placeholders for what the bundle (job) or a widget
    (notebook) fills in: both render this one list, so a notebook runs exactly what its job runs."""
    arguments = ["--engine", engine]
    if engine != SPARK_ML_CONNECT:  # Spark ML keeps its own table (samples.nyctaxi.trips)
        arguments += ["--table", TABLE]
    arguments += ["--output-dir", OUTPUT_DIR, "--epochs", EPOCHS, "--mlflow-experiment", EXPERIMENT]
    if engine == SPARK_ML_CONNECT:
        # pyspark.ml over Spark Connect: the Standard runtime has no torch, which pyspark.ml.connect's evaluator needs.
        return [*arguments, "--spark-ml-api", "classic"]
    if is_serverless(answers):
        nodes, gpus = nodes_and_gpus(answers)
        arguments = [*arguments, "--handoff-to-torchrun"]
    else:
        cluster = job_cluster(answers, engine)
        nodes, gpus = max(cluster.get("num_workers", 0), 1), gpus_per_node(cluster["node_type_id"])
    return [*arguments, "--num-nodes", str(nodes), "--gpus-per-node", str(gpus),
            *TASK_ARGUMENTS.get(answers.get("task", ""), [])]


def task_table(answers: Mapping) -> str:
    """The table the chosen task trains on by default."""
    return importlib.import_module(f"{__package__}.tasks.{answers['task']}").DEFAULT_TABLE


def is_serverless(answers: Mapping) -> bool:
    return answers.get("compute", serverless.CLASSIC) == serverless.SERVERLESS_GPU


def nodes_and_gpus(answers: Mapping) -> tuple[int, int]:
    """Serverless GPU: (nodes, GPUs per node) of the answers' accelerators."""
    accelerator = serverless.ACCELERATORS[answers["accelerator_type"]]
    count = int(answers["accelerator_count"])
    return count // accelerator.gpus_per_node, accelerator.gpus_per_node


def check_answers(answers: Mapping) -> list[Finding]:
    """Every finding about a set of answers; the hook refuses to generate while any is an error."""
    findings = list(_check_plain_answers(answers))
    if any(finding.is_error for finding in findings):
        return findings  # the compute rules need valid cloud, engine, compute and numbers
    if is_serverless(answers):
        return [*_mixed_answers(answers, CLASSIC_ANSWERS, "classic cluster", "serverless_gpu"),
                *serverless.check_engine(answers["engine"]),
                *serverless.check_accelerators(answers["accelerator_type"], int(answers["accelerator_count"]))]
    findings += _mixed_answers(answers, SERVERLESS_ANSWERS, "serverless GPU", "classic")
    for engine in chosen_engines(answers):
        request = request_from_cluster(job_cluster(answers, engine), (engine,), answers["cloud"])
        for finding in check_cluster(request):
            if engine == SPARK_ML_CONNECT and answers["engine"] == ALL_ENGINES and finding.path == "node_type_id":
                finding = Finding(finding.rule, finding.message, finding.fix, path="cpu_node_type_id",
                                  severity=finding.severity)
            findings.append(finding)
    return list(dict.fromkeys(findings))


# The answers of one kind of compute, with their defaults (computed from the answers before them).
CLASSIC_ANSWERS = {
    "node_type_id": lambda answers: default_node_type(answers["cloud"], answers["engine"]),
    "cpu_node_type_id": lambda answers: default_cpu_node_type(answers["cloud"]),
    "num_workers": lambda answers: "0",
    "spark_version": lambda answers: default_spark_version(answers["engine"]),
    "allow_unknown_node_type": lambda answers: "no",
}
SERVERLESS_ANSWERS = {
    "accelerator_type": lambda answers: serverless.DEFAULT_ACCELERATOR,
    "accelerator_count": lambda answers: str(serverless.default_accelerator_count(answers["accelerator_type"])),
}


def _mixed_answers(answers: Mapping, other: dict, kind: str, compute: str):
    """Answers for the compute not chosen, changed from their defaults: they would be silently ignored."""
    if answers["engine"] not in ENGINES:
        return  # `all`: the engine rule says what to do; the defaults cannot be computed
    for name, default in other.items():
        if name in answers and str(answers[name]).strip() != default(answers):
            yield Finding("mixed-compute-answers",
                          f"{name} {answers[name]!r} is a {kind} setting, but compute is {compute}",
                          f"leave {name} at its default ({default(answers)}), or answer compute="
                          f"{'classic' if compute == 'serverless_gpu' else 'serverless_gpu'}", path=name)


def _check_plain_answers(answers: Mapping):
    name = str(answers["project_name"])
    if not PROJECT_NAME.fullmatch(name):
        yield Finding("invalid-project-name", f"project_name {name!r} is not a plain one-line name",
                      "use letters, digits, spaces and . , ' ( ) & + - (at most 100, starting with a letter or "
                      "digit), e.g. My Training", path="project_name")
    slug = answers["project_slug"]
    if not SLUG.fullmatch(slug):
        yield Finding("invalid-project-slug", f"project_slug {slug!r} is not a valid bundle and folder name",
                      "use lowercase letters, digits, '-' and '_', starting with a letter (at most 63)",
                      path="project_slug")
    package = answers["package_name"]
    if not package.isidentifier() or keyword.iskeyword(package) or package != package.lower() or not package.isascii():
        yield Finding("invalid-package-name", f"package_name {package!r} is not a lowercase Python identifier",
                      "use lowercase letters, digits and '_', starting with a letter, e.g. my_training",
                      path="package_name")
    elif package in RESERVED_PACKAGES:
        yield Finding("reserved-package-name", f"package_name {package!r} would shadow the {package} package",
                      "pick a name of your own, e.g. my_training", path="package_name")
    if answers["cloud"] not in CLOUDS:
        yield Finding("invalid-cloud", f"cloud {answers['cloud']!r} is not one of {', '.join(CLOUDS)}",
                      f"answer one of {', '.join(CLOUDS)}", path="cloud")
    if answers.get("task", TASKS[0]) not in TASKS:
        yield Finding("invalid-task", f"task {answers['task']!r} is not one of {', '.join(TASKS)}",
                      f"answer one of {', '.join(TASKS)}", path="task")
    if answers["engine"] not in (*ENGINES, ALL_ENGINES):
        yield Finding("invalid-engine", f"engine {answers['engine']!r} is not one of {', '.join(ENGINES)}, all",
                      f"answer one of {', '.join(ENGINES)} or all", path="engine")
    num_workers = str(answers["num_workers"]).strip()
    if not num_workers.isdigit() or int(num_workers) > 256:
        yield Finding("invalid-num-workers", f"num_workers {answers['num_workers']!r} is not a whole number from 0 to 256",
                      "answer 0 for one node (the default), or the number of worker nodes", path="num_workers")
    for name in ("catalog", "schema"):
        if not UC_NAME.fullmatch(str(answers[name])):
            yield Finding(f"invalid-{name}", f"{name} {answers[name]!r} is not a Unity Catalog name",
                          "use letters, digits and '_', starting with a letter or '_'", path=name)
    compute = answers.get("compute", serverless.CLASSIC)
    if compute not in serverless.COMPUTE_CHOICES:
        yield Finding("invalid-compute", f"compute {compute!r} is not one of {', '.join(serverless.COMPUTE_CHOICES)}",
                      f"answer {' or '.join(serverless.COMPUTE_CHOICES)}", path="compute")
    count = str(answers.get("accelerator_count", "1")).strip()
    if not count.isdigit():
        yield Finding("invalid-accelerator-count", f"accelerator_count {answers['accelerator_count']!r} is not a "
                      "whole number", "answer the number of GPUs in all, e.g. 1 (GPU_1xA10) or 8 (GPU_8xH100)",
                      path="accelerator_count")
    if answers.get("allow_unknown_node_type", "no") not in YES_NO:
        yield Finding("invalid-allow-unknown-node-type",
                      f"allow_unknown_node_type {answers['allow_unknown_node_type']!r} is not yes or no",
                      "answer yes or no", path="allow_unknown_node_type")

