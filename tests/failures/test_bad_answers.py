"""Every kind of bad answer to the template is refused with the rule and its fix, and nothing is written.

The answer checks (`answers.check_answers`) run while cookiecutter renders the project folder's name, before it
creates anything (the template's `_extensions` step, `local_extensions.refuse_bad_answers`): a refusal names the
rule and a fix that says which answer to give, leaves nothing behind (a slug with a '/' included), and reaches the
command line as cookiecutter's FailedHookException: a message and exit code 1, no traceback. Answers outside a
choice list (cloud, engine, task, compute, accelerator_type, allow_unknown_node_type) are refused by cookiecutter
itself before the template runs, naming the choices: its command line shows that one with a traceback (a limit
the template cannot lift; the README says so).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cookiecutter.exceptions import FailedHookException

from distributed_training.compute.catalog import default_catalog
from distributed_training.tooling.answers import ANSWERS, DEPENDENCIES, check_answers

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "distributed-training"
COOKIECUTTER = Path(sys.executable).with_name("cookiecutter")
REFUSAL_SECONDS = 10  # a refusal comes before anything is rendered: well within this on 2 slow cores

INJECTIONS = ["$(touch pwned)", "x; rm -rf ~", "`id`", "a && b", "x' OR '1'='1", "<script>", "${var.catalog}",
              "name\nbundle:\n  name: evil", "{{ cookiecutter.__class__ }}x"]

# (answers, the rule the hook must name)
REFUSED_BY_THE_HOOK = [
    # names
    *[({"project_slug": slug}, "invalid-project-slug") for slug in [
        "My Project!", "UPPER", "1starts-with-digit", "has space", "../escape", "x" * 64, "-dash",
        "ünïcode", "_underscore", "a/b", "a\\b", *INJECTIONS]],
    *[({"project_name": name, "project_slug": "ok"}, "invalid-project-name") for name in [
        'He said "hi"', "line one\nline two", "A: B", "My #1 Training", "back\\slash", "x" * 101,
        *[text for text in INJECTIONS if text != "a && b"]]],  # '&' is fine in a name
    ({"project_name": 'Quoted "Name"'}, "invalid-project-slug"),  # the slug made from it is refused too
    ({"project_name": ""}, "invalid-project-name"),
    *[({"package_name": package}, "invalid-package-name") for package in [
        "class", "my-pkg", "Pkg", "", "1pkg", "pkg.sub", "__import__('os')", "ünï", *INJECTIONS]],
    # names that shadow a dependency or the standard library
    *[({"package_name": package}, "reserved-package-name") for package in [
        "torch", "pyspark", "tests", "ray", "yaml", "json", "os", "mlflow", "databricks", "deepspeed", "logging",
        "pytest", "typing", "pandas", "numpy", "pyarrow"]],
    *[({"project_slug": slug}, "reserved-project-slug") for slug in ["torch", "pyspark", "mlflow-skinny", "pyyaml"]],
    *[({name: value}, f"invalid-{name}") for name in ("catalog", "schema") for value in [
        "", "main; DROP TABLE x", "my-catalog", "`main`", "main.default", "1abc", *INJECTIONS]],
    # names that YAML reads as null, a boolean or a number where they stand alone
    *[({name: value}, "answer-read-as-yaml-value") for name in ("catalog", "schema") for value in [
        "null", "NULL", "true", "False", "yes", "on", "OFF", "n", "y"]],
    *[({"project_slug": slug}, "answer-read-as-yaml-value") for slug in ["null", "yes", "on", "true", "off", "n"]],
    *[({"project_name": name}, "answer-read-as-yaml-value") for name in ["Null", "Yes", "ON"]],  # slug from it
    *[({"package_name": package}, "answer-read-as-yaml-value") for package in ["null", "yes", "on", "off", "true"]],
    # spaces or line breaks around an answer: refused, everywhere alike
    *[({name: value}, "answer-surrounding-space") for name, value in [
        ("project_name", " leading space"), ("project_name", "My Training "), ("project_slug", "abc\n"),
        ("package_name", "pkg\n"), ("catalog", "main\n"), ("schema", " default"),
        ("node_type_id", " Standard_NC64as_T4_v3"), ("num_workers", " 2"), ("num_workers", "0 "),
        ("spark_version", "17.3.x-scala2.13 "), ("cpu_node_type_id", "Standard_D8ds_v5 ")]],
    ({"compute": "serverless_gpu", "accelerator_count": "1 "}, "answer-surrounding-space"),
    # node types
    ({"node_type_id": ""}, "unknown-node-type"),
    ({"node_type_id": "Standard_NC64as_T4_v4"}, "unknown-node-type"),
    ({"node_type_id": "Standard_NC64as_T4_v3\n  evil: 1"}, "unknown-node-type"),
    ({"node_type_id": "$(reboot)"}, "unknown-node-type"),
    ({"cloud": "aws", "node_type_id": "Standard_NC64as_T4_v3"}, "node-type-wrong-cloud"),
    ({"cloud": "gcp", "node_type_id": "g5.12xlarge"}, "node-type-wrong-cloud"),
    ({"engine": "all", "cpu_node_type_id": "nope"}, "unknown-node-type"),
    # counts
    *[({"num_workers": count}, "invalid-num-workers") for count in [
        "two", "-1", "", "1.5", "100000", "0x10", "1e3", "2; echo", "257", "+2", "010", "1_0",
        "\u00b2", "\u0663", "\uff12", "\u2460", "\U0001d7da"]],  # superscript, Arabic-Indic, fullwidth, circled, math
    *[({"compute": "serverless_gpu", "accelerator_count": count}, "invalid-accelerator-count") for count in [
        "\u00b2", "\u0661", "08", "1e3", "0x10", "-1"]],
    ({"compute": "serverless_gpu", "accelerator_type": "GPU_8xH100", "accelerator_count": "100000"},
     "invalid-accelerator-count"),
    ({"compute": "serverless_gpu", "accelerator_type": "GPU_8xH100", "accelerator_count": "2056"},
     "invalid-accelerator-count"),  # 257 nodes: workers stop at 256
    ({"compute": "serverless_gpu", "accelerator_count": "257"}, "invalid-accelerator-count"),
    # retired node types (Microsoft's retirement notices): refused however many workers
    ({"node_type_id": "Standard_NC24s_v3", "num_workers": "2"}, "retired-node-type"),
    ({"engine": "deepspeed", "node_type_id": "Standard_NC12s_v3"}, "retired-node-type"),
    # runtimes
    *[({"spark_version": version}, "unknown-spark-version") for version in [
        "", "latest", "17.3", "seventeen", "17.3.x-gpu-ml-scala2.13\nfoo: bar", "$(id)"]],
    ({"spark_version": "12.2.x-gpu-ml-scala2.12"}, "runtime-too-old"),
    ({"spark_version": "17.3.x-cpu-ml-scala2.13"}, "gpu-node-cpu-runtime"),
    ({"spark_version": "17.3.x-photon-scala2.13"}, "photon-on-gpu"),
    # engine and runtime mismatches
    ({"engine": "spark_ml_connect", "spark_version": "16.4.x-scala2.12"}, "runtime-too-old"),
    ({"engine": "deepspeed", "spark_version": "13.3.x-gpu-ml-scala2.12"}, "runtime-too-old"),
    ({"engine": "deepspeed", "node_type_id": "Standard_D8ds_v5", "spark_version": "17.3.x-cpu-ml-scala2.13"},
     "engine-needs-gpu"),
    ({"engine": "ray", "spark_version": "12.1.x-gpu-ml-scala2.12"}, "runtime-too-old"),
    ({"engine": "torch_distributor", "node_type_id": "Standard_D8ds_v5", "spark_version": "17.3.x-gpu-ml-scala2.13"},
     "gpu-runtime-cpu-node"),
    ({"engine": "spark_ml_connect", "node_type_id": "Standard_NC64as_T4_v3"}, "ml-on-standard-access"),
    # serverless GPU answers
    ({"compute": "serverless_gpu", "engine": "ray"}, "serverless-gpu-engine"),
    ({"compute": "serverless_gpu", "engine": "deepspeed", "accelerator_type": "GPU_8xH100",
      "accelerator_count": "12"}, "serverless-gpu-accelerator-count"),
    ({"compute": "serverless_gpu", "engine": "deepspeed", "num_workers": "2"}, "mixed-compute-answers"),
    ({"compute": "serverless_gpu", "accelerator_count": "two"}, "invalid-accelerator-count"),
    # answers the chosen engine or compute would ignore: refused alike
    ({"engine": "torch_distributor", "cpu_node_type_id": "Standard_D16ds_v5"}, "mixed-engine-answers"),
    ({"engine": "ray", "cloud": "aws", "cpu_node_type_id": "m5d.4xlarge"}, "mixed-engine-answers"),
    ({"engine": "all", "accelerator_type": "GPU_8xH100"}, "mixed-compute-answers"),
    ({"engine": "all", "accelerator_count": "8"}, "mixed-compute-answers"),
    ({"compute": "serverless_gpu", "engine": "torch_distributor", "allow_unknown_node_type": "yes"},
     "mixed-compute-answers"),
    ({"compute": "serverless_gpu", "engine": "torch_distributor", "cpu_node_type_id": "Standard_D16ds_v5"},
     "mixed-compute-answers"),
]

# (answers, what cookiecutter's own refusal names)
REFUSED_BY_COOKIECUTTER = [
    ({"cloud": "mars"}, "choice variable cloud"),
    ({"cloud": ""}, "choice variable cloud"),
    ({"cloud": "AWS"}, "choice variable cloud"),
    ({"engine": "tensorflow"}, "choice variable engine"),
    ({"engine": ""}, "choice variable engine"),
    ({"engine": "torch_distributor; rm -rf ~"}, "choice variable engine"),
    ({"allow_unknown_node_type": "maybe"}, "choice variable allow_unknown_node_type"),
    ({"task": "vision"}, "choice variable task"),
    ({"compute": "serverless"}, "choice variable compute"),
    ({"accelerator_type": "GPU_2xA100"}, "choice variable accelerator_type"),
]


def _id(case) -> str:
    answers, expected = case
    return f"{expected}:{answers!r}"[:80]


@pytest.mark.parametrize("answers, rule", REFUSED_BY_THE_HOOK, ids=map(_id, REFUSED_BY_THE_HOOK))
def test_the_hook_refuses_with_the_rule_and_its_fix_and_writes_nothing(generation, capfd, answers, rule):
    started = time.monotonic()
    with pytest.raises(FailedHookException):
        generation.render(**answers)
    took = time.monotonic() - started
    hook_output = capfd.readouterr().err
    assert f"[{rule}]" in hook_output
    [fix] = [line for line in hook_output.split(f"[{rule}]", 1)[1].splitlines() if line.strip().startswith("fix:")][:1]
    assert _names_an_answer(fix), fix
    assert "Nothing was generated" in hook_output and "Traceback" not in hook_output
    assert generation.left_behind() == []
    assert took < REFUSAL_SECONDS


def _names_an_answer(fix: str) -> bool:
    return re.search(r"\b(%s)=" % "|".join(ANSWERS), fix) is not None


@pytest.mark.parametrize("node_type_id", ["Standard_NC24s_v3", "Standard_NC6s_v3", "Standard_NC24rs_v3"])
def test_a_retired_node_type_is_refused_naming_its_replacements_and_writes_nothing(generation, capfd, node_type_id):
    """Microsoft's NCv3 retirement notice (Standard_NC6s/12s/24s_v3, 2025-09-30) and NC24rs_v3's (2025-03-31): a
    cluster of them cannot start, so `cookiecutter ... cloud=azure node_type_id=<it> num_workers=0` is refused."""
    with pytest.raises(FailedHookException):
        generation.render(cloud="azure", node_type_id=node_type_id, num_workers=0)
    hook_output = capfd.readouterr().err
    [line] = [line for line in hook_output.splitlines() if "[retired-node-type]" in line]
    fix = hook_output.split(line, 1)[1].splitlines()[1]
    assert line.startswith("node_type_id: error") and node_type_id in line
    assert fix.strip().startswith("fix:")
    assert all(replacement in fix for replacement in default_catalog().find(node_type_id).retired.replacements)
    assert generation.left_behind() == []


def test_an_unknown_task_is_refused_by_the_answer_checks_too():
    """cookiecutter's choice list stops it first; the rule guards callers that pass answers directly."""
    answers = {"project_name": "My Training", "project_slug": "my-training", "package_name": "my_training",
               "cloud": "azure", "engine": "torch_distributor", "task": "vision", "num_workers": "0",
               "catalog": "main", "schema": "default"}
    assert [(finding.rule, finding.path) for finding in check_answers(answers)] == [("invalid-task", "task")]


@pytest.mark.parametrize("answers, names", REFUSED_BY_COOKIECUTTER, ids=map(_id, REFUSED_BY_COOKIECUTTER))
def test_answers_outside_a_choice_list_are_refused_naming_the_choices(generation, answers, names):
    with pytest.raises(ValueError, match=f"{names}, but the choices are") as error:
        generation.render(**answers)
    assert repr(next(iter(answers.values()))).strip("'") in str(error.value)
    assert generation.left_behind() == []


@pytest.mark.parametrize("slug", ["a/b", "../escape", "a/../../b", "/tmp/abs"])
def test_a_slug_with_a_separator_leaves_nothing(generation, capfd, slug):
    """The answers are refused while the folder's name is rendered, before cookiecutter creates it (or its
    parents): nothing is left behind."""
    with pytest.raises(FailedHookException):
        generation.render(project_slug=slug)
    assert "[invalid-project-slug]" in capfd.readouterr().err
    assert generation.left_behind() == []


def test_every_fix_of_every_refusal_names_an_answer():
    """A fix says which answer to give (`answer NAME=...`), never a bundle setting the template derives."""
    from cookiecutter.generate import generate_context
    from cookiecutter.prompt import prompt_for_config

    sys.path.insert(0, str(TEMPLATE))  # the template's _extensions
    try:
        for answers, rule in REFUSED_BY_THE_HOOK + WARNED:
            context = generate_context(str(TEMPLATE / "cookiecutter.json"),
                                       extra_context={key: str(value) for key, value in answers.items()})
            findings = check_answers(prompt_for_config(context, no_input=True))
            assert rule in {finding.rule for finding in findings}, (answers, findings)
            for finding in findings:
                assert finding.path in ANSWERS, finding
                assert _names_an_answer(finding.fix), finding
    finally:
        sys.path.remove(str(TEMPLATE))


# Accepted with a warning: the fix names an answer too.
WARNED = [({"cloud": "aws", "num_workers": "2"}, "multi-node-unproven"),
          ({"node_type_id": "not_in_catalog", "allow_unknown_node_type": "yes"}, "unknown-node-type")]


def test_the_answers_are_the_keys_of_cookiecutter_json():
    keys = [key for key in json.loads((TEMPLATE / "cookiecutter.json").read_text()) if not key.startswith("_")]
    assert sorted(keys) == sorted(ANSWERS)


def test_every_dependency_of_a_generated_project_is_a_reserved_name():
    """The reserved package names follow the template's own dependency list."""
    pyproject = (TEMPLATE / "{{cookiecutter.project_slug}}" / "pyproject.toml").read_text()
    named = {re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower()
             for requirement in re.findall(r'"([A-Za-z][A-Za-z0-9_.\-]*(?:\[[^\]]*\])?[<>=!~][^"]*)"', pyproject)}
    named |= {"distributed-training", "databricks-connect"}  # the tool's requirement and the connect group
    assert named and named <= set(DEPENDENCIES), named - set(DEPENDENCIES)


def _cookiecutter_cli(tmp_path: Path, *answers: str) -> tuple[subprocess.CompletedProcess, float]:
    out = tmp_path / "work" / "out"
    out.mkdir(parents=True)
    env = {**os.environ, "HOME": str(tmp_path)}  # its replay file goes to the test's folder, not the user's
    started = time.monotonic()
    completed = subprocess.run([str(COOKIECUTTER), str(TEMPLATE), "--no-input", "-o", str(out), *answers],
                               capture_output=True, text=True, env=env, timeout=120)
    return completed, time.monotonic() - started


# (answers on cookiecutter's command line, the rule, a word of the fix)
REFUSED_ON_THE_COMMAND_LINE = [
    (["project_slug=a/b"], "invalid-project-slug", "project_slug="),
    (["num_workers=\u00b2"], "invalid-num-workers", "num_workers=0"),
    (["catalog=null"], "answer-read-as-yaml-value", "catalog="),
    (["package_name=yaml"], "reserved-package-name", "package_name=yaml_training"),
    (["num_workers= 2"], "answer-surrounding-space", "num_workers='2'"),
    (["engine=torch_distributor", "cpu_node_type_id=Standard_D16ds_v5"], "mixed-engine-answers", "engine=all"),
]


@pytest.mark.parametrize("answers, rule, fix", REFUSED_ON_THE_COMMAND_LINE,
                         ids=[case[1] for case in REFUSED_ON_THE_COMMAND_LINE])
def test_cookiecutters_command_line_refuses_with_exit_1_and_no_traceback(tmp_path, answers, rule, fix):
    completed, took = _cookiecutter_cli(tmp_path, *answers)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output
    assert f"[{rule}]" in output and fix in output and "Nothing was generated" in output, output
    assert "Traceback" not in output
    assert [path for path in tmp_path.rglob("*") if "out" in path.parts and path.name != "out"] == []
    assert took < REFUSAL_SECONDS + 5  # a process of its own: starting Python and cookiecutter


def test_a_value_outside_a_choice_list_is_cookiecutters_own_refusal(tmp_path):
    """The documented limit: cookiecutter checks choice answers given on its command line before the template's
    code runs (no hook or extension sees them), and prints a traceback whose last line names the answer and its
    choices. Nothing is written; the exit code is 1."""
    completed, took = _cookiecutter_cli(tmp_path, "cloud=mars")
    last = completed.stderr.strip().splitlines()[-1]
    assert completed.returncode == 1
    assert last == "ValueError: mars provided for choice variable cloud, but the choices are ['azure', 'aws', 'gcp']."
    assert [path for path in tmp_path.rglob("*") if "out" in path.parts and path.name != "out"] == []


def test_the_matrix_tries_enough_bad_answers():
    """The matrix is the point: keep it broad (the report quotes its size); each class keeps its cases."""
    assert len(REFUSED_BY_THE_HOOK) + len(REFUSED_BY_COOKIECUTTER) + len(REFUSED_ON_THE_COMMAND_LINE) >= 220
    rules = [rule for _, rule in REFUSED_BY_THE_HOOK]
    for rule, at_least in {"answer-read-as-yaml-value": 30, "reserved-package-name": 15, "reserved-project-slug": 4,
                           "answer-surrounding-space": 12, "invalid-num-workers": 17,
                           "invalid-accelerator-count": 10, "mixed-engine-answers": 2,
                           "mixed-compute-answers": 5}.items():
        assert rules.count(rule) >= at_least, rule


SUGGESTED = re.compile(r"\banswer (\w+)=([^\s,;()]+)")
OTHER_RUNTIMES = ["12.2.x-gpu-ml-scala2.12", "13.3.x-gpu-ml-scala2.12", "15.4.x-gpu-ml-scala2.12",
                  "16.4.x-scala2.12", "17.3.x-scala2.13", "17.3.x-cpu-ml-scala2.13", "17.3.x-gpu-ml-scala2.13",
                  "17.3.x-photon-scala2.13", "latest"]


def _classic_answers(cloud: str, engine: str, **changed: str) -> dict:
    """Every answer at the template's default for the cloud and engine (as cookiecutter.json computes them), then
    `changed`."""
    from distributed_training.tooling.answers import SERVERLESS_ANSWERS, default_cpu_node_type, default_node_type
    from distributed_training.tooling.cluster_specs import default_spark_version

    answers = {"project_name": "My Training", "project_slug": "my-training", "package_name": "my_training",
               "cloud": cloud, "engine": engine, "task": "fare_regression", "compute": "classic",
               "node_type_id": default_node_type(cloud, engine), "cpu_node_type_id": default_cpu_node_type(cloud),
               "num_workers": "0", "spark_version": default_spark_version(engine), "catalog": "main",
               "schema": "default", "allow_unknown_node_type": "no"}
    answers["accelerator_type"] = SERVERLESS_ANSWERS["accelerator_type"](answers)
    answers["accelerator_count"] = SERVERLESS_ANSWERS["accelerator_count"](answers)
    return {**answers, **changed}


def _answer_matrix():
    """Every cloud and engine with every node type of the catalog (every cloud's, retired ones too) as the training
    and the CPU node type, on one node and on three, with runtimes of every kind, and on serverless GPU compute with
    every accelerator and counts that fit it or not."""
    catalog = default_catalog()
    for cloud in ("azure", "aws", "gcp"):
        for engine in ("torch_distributor", "deepspeed", "ray", "spark_ml_connect", "all"):
            for node in catalog.node_types:
                for workers in ("0", "2"):
                    yield _classic_answers(cloud, engine, node_type_id=node.id, num_workers=workers)
                if engine == "all":
                    yield _classic_answers(cloud, engine, cpu_node_type_id=node.id)
            for runtime in OTHER_RUNTIMES:
                for workers in ("0", "2"):
                    yield _classic_answers(cloud, engine, spark_version=runtime, num_workers=workers)
            for accelerator in ("GPU_1xA10", "GPU_1xH100", "GPU_8xH100"):
                for count in ("0", "1", "2", "8", "12", "16", "2056"):
                    yield _classic_answers(cloud, engine, compute="serverless_gpu", accelerator_type=accelerator,
                                           accelerator_count=count)


def test_no_fix_repeats_the_answer_given_nor_offers_another_cloud_s_node_type():
    """A fix the user can take: the answer it suggests differs from the one given (a refused spark_version is not
    offered again), and every node type it names is one of the answered cloud's, in the catalog."""
    catalog = default_catalog()
    refusals, suggestions = 0, 0
    for answers in _answer_matrix():
        for finding in check_answers(answers):
            if not finding.is_error:
                continue
            refusals += 1
            for name, value in SUGGESTED.findall(finding.fix):
                suggestions += 1
                assert value != str(answers.get(name)), (answers, str(finding))
                if name in ("node_type_id", "cpu_node_type_id"):
                    assert catalog.find(value) is not None, (answers, str(finding))
            offered = [catalog.find(word) for word in re.findall(r"[\w.-]+", finding.fix) if catalog.find(word)]
            assert {node.cloud for node in offered} <= {answers["cloud"]}, (answers, str(finding))
    assert refusals >= 3900 and suggestions >= refusals  # the matrix's size, counted: keep it broad
