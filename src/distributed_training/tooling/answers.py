"""The template's answers: the clusters they ask for, and every check made before a file is written."""

from __future__ import annotations

import keyword
import re
import sys
from typing import Mapping

import yaml

from ..compute.catalog import CLOUDS, default_catalog
from ..compute.guards import check_cluster
from ..compute.requirements import ENGINES, SPARK_ML_CONNECT
from ..compute.runtime import versions
from ..findings import Finding
from . import serverless
from .bundle.jobs_and_clusters import request_from_cluster
from .cluster_specs import default_spark_version, gpus_per_node, new_cluster

ALL_ENGINES = "all"
FINE_TUNE = "fine_tune"
TASKS = ("fare_regression", "causal_lm", FINE_TUNE)
SLUG = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
UC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
# What a generated project installs or runs with: distribution name -> the package it imports. A project named like
# one of them, or a package named like one of the imports or a module of the standard library, would shadow it.
DEPENDENCIES = {
    "pyyaml": "yaml", "psutil": "psutil", "pyspark": "pyspark", "pandas": "pandas", "numpy": "numpy",
    "pyarrow": "pyarrow", "torch": "torch", "deepspeed": "deepspeed", "ray": "ray", "mlflow": "mlflow",
    "mlflow-skinny": "mlflow", "scipy": "scipy",
    "torcheval": "torcheval", "databricks-connect": "databricks", "databricks-sdk": "databricks",
    "distributed-training": "distributed_training", "pytest": "pytest", "pytest-timeout": "pytest_timeout",
    "setuptools": "setuptools", "wheel": "wheel", "pip": "pip",
}
# The tool itself is the exception: this repository's own bundle is the template's output under its name.
SELF = {"distributed-training", "distributed_training"}
RESERVED_PACKAGES = {*DEPENDENCIES.values(), *sys.stdlib_module_names, "test", "tests", "examples", "notebooks"} - SELF
RESERVED_SLUGS = {name.replace("_", "-") for name in (*DEPENDENCIES, *DEPENDENCIES.values())} - SELF
# Whole numbers as every YAML reader reads them: ASCII digits, no sign, no leading zero (YAML 1.1 reads 010 as 8).
WHOLE_NUMBER = re.compile(r"0|[1-9][0-9]{0,5}")
MAX_WORKERS = 256
MAX_NODES = MAX_WORKERS  # serverless GPU: accelerator_count is bounded as the workers are, in nodes
# Words that YAML 1.1 readers (PyYAML among them) take for a boolean or null, whatever their case.
YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}
# Answers that land in YAML as a plain scalar of their own (bundle name, variables' defaults, package_name).
YAML_SCALARS = ("project_slug", "package_name", "catalog", "schema")
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
    return catalog_default(cloud, gpu=engine != SPARK_ML_CONNECT)


def default_cpu_node_type(cloud: str) -> str:
    return catalog_default(cloud, gpu=False)


def catalog_default(cloud: str, gpu: bool) -> str:
    """The catalog's default GPU or CPU node type of a cloud (its `defaults`)."""
    return default_catalog().defaults[cloud]["gpu" if gpu else "cpu"]


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


def scoring_cluster(answers: Mapping, engine: str) -> dict:
    """The score job's cluster: the engine's, with one GPU a task where its workers have GPUs (a Ray cluster's tasks
    have none), so that Spark gives each Python worker that loads the model a GPU of its own. On one node Spark
    schedules no GPUs (local mode), and `score` bounds the models a GPU itself (--models-per-gpu)."""
    cluster = job_cluster(answers, engine)
    if "spark_conf" in cluster:  # a multi-node GPU cluster (cluster_specs.new_cluster)
        cluster["spark_conf"] = {**cluster["spark_conf"], "spark.task.resource.gpu.amount": "1"}
    return cluster


# The job's values that the bundle and the platform fill in, and a notebook asks for in widgets (see train_arguments).
TABLE, OUTPUT_DIR, EPOCHS, EXPERIMENT, JOB_RUN = "<table>", "<output_dir>", "<epochs>", "<experiment>", "<job_run>"
SPARK_ML_TABLE = "<spark_ml_table>"  # Spark ML's own: taxi trips, whatever the task
BASE_MODEL = "<base_model>"  # the fine-tuning task's pretrained model: a bundle variable, set once per target


def train_arguments(answers: Mapping, engine: str) -> list[str]:
    """The `train` command line of one engine's job, with placeholders for what the bundle and the platform (job) or
    a widget (notebook) fill in: both render this one list, so a notebook runs exactly what its job runs. No option
    of the task but fine_tune's base model, which has no default that could work (a folder of the user's own): the
    jobs train what task.py's defaults say, so replacing task.py needs no other change (for fine_tune: dropping
    --base-model, which `validate` names)."""
    arguments = ["--engine", engine, "--table", SPARK_ML_TABLE if engine == SPARK_ML_CONNECT else TABLE]
    if engine != SPARK_ML_CONNECT and answers.get("task") == FINE_TUNE:
        arguments += ["--base-model", BASE_MODEL]
    # Each job run its own folder: a retry or a repair resumes there, a new run starts fresh (run_folder.py).
    arguments += ["--output-dir", OUTPUT_DIR, "--job-run-id", JOB_RUN, "--epochs", EPOCHS,
                  "--mlflow-experiment", EXPERIMENT]
    if engine == SPARK_ML_CONNECT:
        # pyspark.ml over Spark Connect: the Standard runtime has no torch, which pyspark.ml.connect's evaluator needs.
        return [*arguments, "--spark-ml-api", "classic"]
    if is_serverless(answers):
        nodes, gpus = nodes_and_gpus(answers)
        arguments = [*arguments, "--handoff-to-torchrun"]
    else:
        cluster = job_cluster(answers, engine)
        nodes, gpus = max(cluster.get("num_workers", 0), 1), gpus_per_node(cluster["node_type_id"])
    return [*arguments, "--num-nodes", str(nodes), "--gpus-per-node", str(gpus)]


# What the fine-tuning task needs beyond Databricks Runtime ML (or the serverless environment), by where it runs: each
# pinned at the version the tests ran (compute/versions.yaml `packages`). Databricks Runtime 17.3 LTS ML (GPU) ships
# transformers 4.51.3, tokenizers 0.21.0, safetensors 0.6.2 and accelerate 1.5.2, and no peft (its release notes,
# "Python libraries on GPU clusters": https://docs.databricks.com/aws/en/release-notes/runtime/17.3lts-ml). The task is
# tested with transformers 5.25.0, a major version on, which requires tokenizers>=0.23.1 and safetensors>=0.8.0: all
# four are installed; accelerate (peft needs >=0.21.0) is the runtime's own. The serverless stage task only tokenizes
# (it has no torch, which peft needs); transformers needs safetensors there too.
TASK_PACKAGES = {FINE_TUNE: {"cluster": ("transformers", "peft", "tokenizers", "safetensors"),
                             "staging": ("transformers", "tokenizers", "safetensors")}}


def task_packages(answers: Mapping, where: str = "cluster") -> list[str]:
    """The chosen task's packages, `name==version`, for the `cluster` (a job cluster's libraries, the serverless GPU
    nodes, the `local` extra) or the serverless `staging` environment; none for a task that needs nothing more, or a
    project whose only engine, Spark ML, trains no task."""
    if not torch_engines(answers):
        return []
    pinned = versions()["packages"]
    return [f"{name}=={pinned[name]}" for name in TASK_PACKAGES.get(answers.get("task"), {}).get(where, ())]


def is_serverless(answers: Mapping) -> bool:
    return answers.get("compute", serverless.CLASSIC) == serverless.SERVERLESS_GPU


def nodes_and_gpus(answers: Mapping) -> tuple[int, int]:
    """Serverless GPU: (nodes, GPUs per node) of the answers' accelerators."""
    accelerator = serverless.ACCELERATORS[answers["accelerator_type"]]
    count = int(answers["accelerator_count"])
    return count // accelerator.gpus_per_node, accelerator.gpus_per_node


def check_answers(answers: Mapping) -> list[Finding]:
    """Every finding about a set of answers; generation is refused while any is an error. Every finding names the
    answer it is about (its path) and a fix in terms of the answers (`answer NAME=VALUE`)."""
    spaced = list(_surrounding_space(answers))
    findings = [*spaced, *_check_plain_answers(answers, skip={finding.path for finding in spaced})]
    if any(finding.is_error for finding in findings):
        return findings  # the compute rules need valid cloud, engine, compute and numbers
    if is_serverless(answers):
        findings = [*_mixed_answers(answers, CLASSIC_ANSWERS, "classic cluster", "serverless_gpu"),
                    *serverless.check_engine(answers["engine"]),
                    *serverless.check_accelerators(answers["accelerator_type"], int(answers["accelerator_count"]))]
        return [_in_answer_terms(finding, answers, None) for finding in findings]
    findings += _mixed_answers(answers, SERVERLESS_ANSWERS, "serverless GPU", "classic")
    findings += _ignored_for_the_engine(answers)
    for engine in chosen_engines(answers):
        request = request_from_cluster(job_cluster(answers, engine), (engine,), answers["cloud"])
        for finding in check_cluster(request):
            if engine == SPARK_ML_CONNECT and answers["engine"] == ALL_ENGINES and finding.path == "node_type_id":
                finding = Finding(finding.rule, finding.message, finding.fix, path="cpu_node_type_id",
                                  severity=finding.severity)
            findings.append(_in_answer_terms(finding, answers, engine))
    return list(dict.fromkeys(findings))


def answer_names() -> tuple[str, ...]:
    """The template's answers (the keys of cookiecutter.json a user can give)."""
    return ANSWERS


ANSWERS = ("project_name", "project_slug", "package_name", "cloud", "engine", "task", "compute", "accelerator_type",
           "accelerator_count", "node_type_id", "cpu_node_type_id", "num_workers", "spark_version", "catalog",
           "schema", "allow_unknown_node_type")
# Cluster settings the template derives from answers: a finding about one is fixed by answering these instead.
DERIVED_FROM = {"data_security_mode": "node_type_id", "driver_node_type_id": "node_type_id",
                "spark_conf": "num_workers", "custom_tags": "num_workers", "kind": "num_workers",
                "is_single_node": "num_workers", "use_ml_runtime": "spark_version", "runtime_engine": "spark_version"}


def _in_answer_terms(finding: Finding, answers: Mapping, engine: str | None) -> Finding:
    """The finding with its path an answer and a fix that says which answer to give (the guards speak of bundle
    settings, such as use_ml_runtime or data_security_mode, which are not answers)."""
    path = finding.path.split(".")[-1].split("[")[0] if finding.path else ""
    name = path if path in ANSWERS else DERIVED_FROM.get(path, "node_type_id" if not path else path)
    if name not in ANSWERS:
        name = "node_type_id"
    if re.search(r"\banswer (%s)=" % "|".join(ANSWERS), finding.fix):
        return Finding(finding.rule, finding.message, finding.fix, path=name, severity=finding.severity)
    if name == "node_type_id" and engine == SPARK_ML_CONNECT and answers["engine"] == ALL_ENGINES:
        name = "cpu_node_type_id"
    suggestion = _suggestion(finding, answers, engine, name)
    if suggestion == str(answers.get(name)) and name in OTHER_HALF:  # the runtime and the node type disagree, and
        name, path = OTHER_HALF[name], ""  # the default of this one is the answer given: the other one is to change
        suggestion = _suggestion(finding, answers, engine, name)
    suggestion = suggestion or "<another value>"
    if name == "spark_version":  # the template sets use_ml_runtime itself: the guards' advice on it does not apply
        fix = f"answer spark_version={suggestion} (the default for {engine or answers['engine']})"
    elif path not in ANSWERS:  # a setting the template derives: its advice names no answer
        fix = f"answer {name}={suggestion}"
    elif _other_clouds_node_types(finding.fix, answers["cloud"]):  # the guard's advice, for the node type's cloud
        fix = f"answer {name}={suggestion}"
    else:
        fix = f"answer {name}={suggestion} ({finding.fix})"
    return Finding(finding.rule, finding.message, fix, path=name, severity=finding.severity)


def _node_types_named(text: str) -> list[str]:
    return re.findall(r"\b(?:Standard_\w+|[a-z]\d[a-z]*\.\w+|[a-z]\d-\w+-\w+)\b", text)


def _other_clouds_node_types(text: str, cloud: str) -> list[str]:
    return [node for node in _node_types_named(text) if getattr(default_catalog().find(node), "cloud", cloud) != cloud]


# A runtime refused with a node type (GPU or not) whose default runtime is the one given: the node type is to change;
# and the other way round. The Spark ML job of engine=all runs the template's own runtime, which is no answer.
OTHER_HALF = {"spark_version": "node_type_id", "node_type_id": "spark_version"}


def _suggestion(finding: Finding, answers: Mapping, engine: str | None, name: str) -> str:
    """A value of answer `name` that the guards accept for `engine`: the template's own default for it."""
    engine = engine or answers["engine"]
    if name == "spark_version":
        return default_spark_version(engine)
    if name in ("node_type_id", "cpu_node_type_id"):
        gpu = engine != SPARK_ML_CONNECT
        current = answers.get(name)
        known = [node for node in _node_types_named(finding.fix) if node != current
                 and getattr(default_catalog().find(node), "cloud", None) == answers["cloud"]]
        return known[0] if known else catalog_default(answers["cloud"], gpu=gpu)
    if name == "num_workers":
        return "0"
    if name == "engine":
        return serverless.SERVERLESS_ENGINES[0]
    if name == "accelerator_count":
        accelerator = serverless.ACCELERATORS.get(answers.get("accelerator_type", ""))
        return str(accelerator.gpus_per_node) if accelerator else ""
    return ""


def _surrounding_space(answers: Mapping):
    """Answers with spaces or line breaks around them: the generated files would keep them verbatim (a YAML value,
    a folder name, a number), so they are refused rather than quietly stripped in some places and not others."""
    for name in ANSWERS:
        value = answers.get(name)
        if isinstance(value, str) and value != value.strip():
            yield Finding("answer-surrounding-space", f"{name} {value!r} has spaces or line breaks around it",
                          f"answer {name}={value.strip()!r} (without them)", path=name)


def _ignored_for_the_engine(answers: Mapping):
    """Answers that the chosen engine does not use, changed from their defaults: refused as the other compute's are."""
    if answers["engine"] != ALL_ENGINES:
        default = default_cpu_node_type(answers["cloud"])
        value = answers.get("cpu_node_type_id", default)
        if value != default:
            yield Finding("mixed-engine-answers",
                          f"cpu_node_type_id {value!r} is the CPU node type of the Spark ML job of engine=all, but "
                          f"engine is {answers['engine']}: it would be ignored",
                          f"answer cpu_node_type_id={default} (its default), or engine=all; for {answers['engine']} "
                          "the node type is node_type_id", path="cpu_node_type_id")


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
    for name, default in other.items():
        if name in answers and str(answers[name]) != default(answers):
            yield Finding("mixed-compute-answers",
                          f"{name} {answers[name]!r} is a {kind} setting, but compute is {compute}: it would be "
                          "ignored",
                          f"answer compute={'classic' if compute == 'serverless_gpu' else 'serverless_gpu'}, or "
                          f"answer {name}={default(answers)} (its default)", path=name)


def _reads_differently(value: str) -> str | None:
    """What YAML makes of `value` when it stands alone as a plain scalar, if not the same string: None, a boolean
    or a number, in YAML 1.1 (PyYAML) or 1.2 (the Databricks CLI)."""
    if value.lower() in YAML_WORDS:
        return "null" if value.lower() in ("null", "~") else "a boolean"
    try:
        loaded = yaml.safe_load(f"key: {value}")
    except yaml.YAMLError:
        return "not a plain value"
    read = loaded.get("key") if isinstance(loaded, dict) else loaded
    if read == value and isinstance(read, str):
        return None
    return "null" if read is None else f"a {type(read).__name__}"


def _valid_name(name: str, value) -> bool:
    if not isinstance(value, str):
        return False
    if name == "project_slug":
        return bool(SLUG.fullmatch(value))
    if name == "package_name":
        return value.isidentifier() and value.isascii() and not keyword.iskeyword(value)
    return bool(UC_NAME.fullmatch(value))


def _check_plain_answers(answers: Mapping, skip: set[str] = frozenset()):
    """The answers one by one (those in `skip` already have a finding)."""
    def given(name: str) -> bool:
        return name not in skip

    name = str(answers["project_name"])
    if given("project_name") and not PROJECT_NAME.fullmatch(name):
        yield Finding("invalid-project-name", f"project_name {name!r} is not a plain one-line name",
                      "answer project_name= with letters, digits, spaces and . , ' ( ) & + - (at most 100, starting "
                      "with a letter or digit), e.g. project_name='My Training'", path="project_name")
    slug = answers["project_slug"]
    if given("project_slug"):
        if not SLUG.fullmatch(slug):
            yield Finding("invalid-project-slug", f"project_slug {slug!r} is not a valid bundle and folder name",
                          "answer project_slug= with lowercase letters, digits, '-' and '_', starting with a letter "
                          "(at most 63), e.g. project_slug=my-training (it comes from project_name unless given)",
                          path="project_slug")
        elif slug in RESERVED_SLUGS:
            yield Finding("reserved-project-slug", f"project_slug {slug!r} is the name of a package the project "
                          "installs: installing the project would replace it",
                          f"answer project_slug={slug}-training (or another name of your own)", path="project_slug")
    package = answers["package_name"]
    if not given("package_name"):
        pass
    elif not package.isidentifier() or keyword.iskeyword(package) or package != package.lower() or not package.isascii():
        yield Finding("invalid-package-name", f"package_name {package!r} is not a lowercase Python identifier",
                      "answer package_name= with lowercase letters, digits and '_', starting with a letter, e.g. "
                      "package_name=my_training", path="package_name")
    elif package in RESERVED_PACKAGES:
        shadowed = "standard library module" if package in sys.stdlib_module_names else "package"
        yield Finding("reserved-package-name", f"package_name {package!r} would shadow the {shadowed} {package}",
                      f"answer package_name={package}_training (or another name of your own)", path="package_name")
    for yaml_name in YAML_SCALARS:
        value = answers.get(yaml_name)
        if given(yaml_name) and _valid_name(yaml_name, value) and (read := _reads_differently(value)):
            yield Finding("answer-read-as-yaml-value", f"{yaml_name} {value!r} stands alone as a value in the "
                          f"generated YAML (databricks.yml, resources/), where YAML reads it as {read}, not a name",
                          f"answer {yaml_name}= with another name, e.g. {yaml_name}={value}_1", path=yaml_name)
    if given("cloud") and answers["cloud"] not in CLOUDS:
        yield Finding("invalid-cloud", f"cloud {answers['cloud']!r} is not one of {', '.join(CLOUDS)}",
                      f"answer cloud= one of {', '.join(CLOUDS)}", path="cloud")
    if given("task") and answers.get("task", TASKS[0]) not in TASKS:
        yield Finding("invalid-task", f"task {answers['task']!r} is not one of {', '.join(TASKS)}",
                      f"answer task= one of {', '.join(TASKS)}", path="task")
    if given("engine") and answers["engine"] not in (*ENGINES, ALL_ENGINES):
        yield Finding("invalid-engine", f"engine {answers['engine']!r} is not one of {', '.join(ENGINES)}, all",
                      f"answer engine= one of {', '.join(ENGINES)} or all", path="engine")
    num_workers = str(answers["num_workers"])
    if given("num_workers") and (not WHOLE_NUMBER.fullmatch(num_workers) or int(num_workers) > MAX_WORKERS):
        yield Finding("invalid-num-workers", f"num_workers {answers['num_workers']!r} is not a whole number from 0 to "
                      f"{MAX_WORKERS} (ASCII digits, no leading zero)",
                      "answer num_workers=0 for one node (the default), or the number of worker nodes",
                      path="num_workers")
    for name in ("catalog", "schema"):
        if given(name) and not UC_NAME.fullmatch(str(answers[name])):
            yield Finding(f"invalid-{name}", f"{name} {answers[name]!r} is not a Unity Catalog name",
                          f"answer {name}= with letters, digits and '_', starting with a letter or '_', e.g. "
                          f"{name}={'main' if name == 'catalog' else 'default'}", path=name)
    compute = answers.get("compute", serverless.CLASSIC)
    if given("compute") and compute not in serverless.COMPUTE_CHOICES:
        yield Finding("invalid-compute", f"compute {compute!r} is not one of {', '.join(serverless.COMPUTE_CHOICES)}",
                      f"answer compute={' or '.join(serverless.COMPUTE_CHOICES)}", path="compute")
    count = str(answers.get("accelerator_count", "1"))
    accelerator = serverless.ACCELERATORS.get(str(answers.get("accelerator_type")))
    per_node = accelerator.gpus_per_node if accelerator else 8
    most = per_node * MAX_NODES
    if given("accelerator_count") and (not WHOLE_NUMBER.fullmatch(count) or int(count) > most):
        yield Finding("invalid-accelerator-count", f"accelerator_count {answers['accelerator_count']!r} is not a "
                      f"whole number from 1 to {most} ({MAX_NODES} nodes of {per_node} GPUs; ASCII digits, no leading "
                      "zero)", f"answer accelerator_count={per_node} (one node), or the number of GPUs in all, a "
                      f"multiple of {per_node}", path="accelerator_count")
    if given("allow_unknown_node_type") and answers.get("allow_unknown_node_type", "no") not in YES_NO:
        yield Finding("invalid-allow-unknown-node-type",
                      f"allow_unknown_node_type {answers['allow_unknown_node_type']!r} is not yes or no",
                      "answer allow_unknown_node_type=yes or allow_unknown_node_type=no",
                      path="allow_unknown_node_type")
