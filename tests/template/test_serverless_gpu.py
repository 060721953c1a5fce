"""compute=serverless_gpu: a serverless task stages and plans, an `ai_runtime_task` runs the loop under torchrun.

Rendered projects for every engine that runs there validate against the CLI's schema and the typed classes; the
answers that cannot work there are refused with the rule and nothing is written; hand edits are caught by `validate`.
"""

from __future__ import annotations

import argparse

import pytest
import yaml
from cookiecutter.exceptions import FailedHookException

from distributed_training.bundle.validate import validate_bundle
from distributed_training.compute.advise import add_arguments, advise, job_from_args
from distributed_training.compute.serverless import ACCELERATORS, SERVERLESS_ENGINES


def errors_of(project, schema):
    findings = validate_bundle(project, targets=["dev", "prod"], schema_path=schema)
    return [str(finding) for per_target in findings.values() for finding in per_target if finding.is_error]


def job_of(project, engine):
    path = project / "resources" / f"train_{engine}.job.yml"
    return yaml.safe_load(path.read_text())["resources"]["jobs"][f"train_{engine}"]


def option(parameters, name):
    return parameters[parameters.index(name) + 1]


@pytest.mark.parametrize("accelerator_type, accelerator_count", [
    ("GPU_1xA10", 1), ("GPU_1xH100", 1), ("GPU_8xH100", 8), ("GPU_8xH100", 16)])
@pytest.mark.parametrize("engine", SERVERLESS_ENGINES)
def test_serverless_projects_validate_and_hand_the_run_to_torchrun(render, bundle_schema, engine, accelerator_type,
                                                                   accelerator_count):
    project = render(compute="serverless_gpu", engine=engine, accelerator_type=accelerator_type,
                     accelerator_count=accelerator_count)
    assert errors_of(project, bundle_schema) == []
    job = job_of(project, engine)
    assert "job_clusters" not in job
    stage, train = job["tasks"]
    parameters = stage["python_wheel_task"]["parameters"]
    assert "--handoff-to-torchrun" in parameters and option(parameters, "--engine") == engine
    per_node = ACCELERATORS[accelerator_type].gpus_per_node
    assert option(parameters, "--gpus-per-node") == str(per_node)
    assert option(parameters, "--num-nodes") == str(accelerator_count // per_node)
    assert train["depends_on"] == [{"task_key": "stage"}]
    (deployment,) = train["ai_runtime_task"]["deployments"]
    assert deployment["compute"] == {"accelerator_type": accelerator_type, "accelerator_count": accelerator_count}
    # The GPU task runs the command the stage task writes: the two must name the same file.
    assert deployment["command_path"] == option(parameters, "--command-path")
    assert deployment["command_path"].startswith("${workspace.root_path}/")  # a workspace file, as the platform runs
    # The nodes get the project's source (the package the command runs) from code_source_path, relative to the file.
    package = stage["python_wheel_task"]["package_name"]
    assert (project / "resources" / train["ai_runtime_task"]["code_source_path"] / package / "training").is_dir()
    environments = {environment["environment_key"]: environment["spec"] for environment in job["environments"]}
    assert {stage["environment_key"], train["environment_key"]} == set(environments)
    assert all("../dist/*.whl" in spec["dependencies"] for spec in environments.values())
    assert ("deepspeed" in environments[train["environment_key"]]["dependencies"]) == (engine == "deepspeed")


def test_a_multi_node_serverless_run_is_a_warning_that_names_the_nodes(render):
    project = render(compute="serverless_gpu", accelerator_type="GPU_1xA10", accelerator_count=4)
    findings = validate_bundle(project, targets=["dev"])["dev"]
    (warning,) = [finding for finding in findings if finding.rule == "serverless-gpu-single-gpu-nodes"]
    assert "4 nodes of one GPU each" in warning.message and "GPU_8xH100" in warning.fix


@pytest.mark.parametrize("answers, rule, words", [
    ({"engine": "ray"}, "serverless-gpu-engine", "ray"),
    ({"engine": "spark_ml_connect"}, "serverless-gpu-engine", "spark_ml_connect"),
    ({"engine": "all"}, "serverless-gpu-engine", "one job per engine"),
    ({"accelerator_type": "GPU_8xH100", "accelerator_count": "12"}, "serverless-gpu-accelerator-count",
     "not a positive multiple of 8"),
    ({"accelerator_count": "two"}, "invalid-accelerator-count", "'two'"),
    ({"num_workers": "2"}, "mixed-compute-answers", "num_workers '2' is a classic cluster setting"),
    ({"node_type_id": "Standard_NC24ads_A100_v4"}, "mixed-compute-answers", "answer compute=classic"),
])
def test_answers_that_cannot_run_on_serverless_gpu_are_refused(render, tmp_path, capfd, answers, rule, words):
    with pytest.raises(FailedHookException):
        render(tmp_path, compute="serverless_gpu", **answers)
    assert list(tmp_path.iterdir()) == []
    stderr = capfd.readouterr().err
    assert f"[{rule}]" in stderr and words in stderr, stderr


@pytest.mark.parametrize("answers, words", [
    ({"accelerator_type": "GPU_8xH100"}, "accelerator_type 'GPU_8xH100' is a serverless GPU setting"),
    ({"accelerator_count": "4"}, "answer compute=serverless_gpu"),
])
def test_serverless_answers_on_classic_compute_are_refused(render, tmp_path, capfd, answers, words):
    with pytest.raises(FailedHookException):
        render(tmp_path, **answers)
    assert list(tmp_path.iterdir()) == []
    assert words in capfd.readouterr().err


def test_an_unknown_compute_is_refused_by_the_answer_checks():
    """Cookiecutter refuses a value outside a choice list itself; the hook's checks serve other callers too."""
    from distributed_training.answers import check_answers

    answers = {"project_name": "P", "project_slug": "p", "package_name": "p", "cloud": "aws",
               "engine": "torch_distributor", "compute": "gpu", "num_workers": "0", "catalog": "main",
               "schema": "default"}
    (finding,) = check_answers(answers)
    assert finding.rule == "invalid-compute" and "classic or serverless_gpu" in finding.fix


def edit_gpu_task(project, engine, edit):
    path = project / "resources" / f"train_{engine}.job.yml"
    tree = yaml.safe_load(path.read_text())
    edit(tree["resources"]["jobs"][f"train_{engine}"])
    path.write_text(yaml.safe_dump(tree, sort_keys=False))


@pytest.mark.parametrize("edit, rule", [
    (lambda job: job["tasks"][1].update(job_cluster_key="training"), "mixed-compute"),
    (lambda job: job["tasks"][1]["ai_runtime_task"]["deployments"].append(
        job["tasks"][1]["ai_runtime_task"]["deployments"][0]), "serverless-gpu-deployments"),
    (lambda job: job["tasks"][1]["ai_runtime_task"]["deployments"][0]["compute"].update(
        accelerator_type="GPU_8xH100", accelerator_count=12),
     "serverless-gpu-accelerator-count"),
    (lambda job: job["tasks"][1]["ai_runtime_task"]["deployments"][0]["compute"].update(
        accelerator_type="GPU_4xA100"), "serverless-gpu-accelerator-type"),
    (lambda job: job["tasks"][0]["python_wheel_task"]["parameters"].__setitem__(1, "ray"), "serverless-gpu-engine"),
])
def test_validate_catches_hand_edits_of_a_serverless_job(render, edit, rule):
    project = render(compute="serverless_gpu")
    edit_gpu_task(project, "torch_distributor", edit)
    findings = validate_bundle(project, targets=["dev"])["dev"]
    assert rule in {finding.rule for finding in findings if finding.is_error}, [str(f) for f in findings]


def test_a_command_path_outside_the_workspace_is_a_warning_with_the_fix(render):
    project = render(compute="serverless_gpu")
    assert "serverless-gpu-command-path" not in {f.rule for f in validate_bundle(project, targets=["dev"])["dev"]}
    edit_gpu_task(project, "torch_distributor", lambda job: job["tasks"][1]["ai_runtime_task"]["deployments"][0]
                  .update(command_path="/Volumes/main/default/training/torchrun/command.sh"))
    (finding,) = [f for f in validate_bundle(project, targets=["dev"])["dev"] if f.rule == "serverless-gpu-command-path"]
    assert finding.severity == "warning" and "/Volumes/main/default/training" in finding.message
    assert "--command-path" in finding.fix and finding.path.endswith("deployments[0].command_path")


def test_a_code_source_path_that_names_nothing_in_the_project_is_an_error_with_the_fix(render):
    project = render(compute="serverless_gpu")
    assert "code-source-missing" not in {f.rule for f in validate_bundle(project, targets=["dev"])["dev"]}
    edit_gpu_task(project, "torch_distributor", lambda job: job["tasks"][1]["ai_runtime_task"]
                  .update(code_source_path="./src"))  # relative to resources/, not to the project
    (finding,) = [f for f in validate_bundle(project, targets=["dev"])["dev"] if f.rule == "code-source-missing"]
    assert finding.is_error and finding.file == "resources/train_torch_distributor.job.yml"
    assert "names resources/src" in finding.message and "../src" in finding.fix


@pytest.mark.parametrize("model", ["gpt2", "llama-7b", "llama-70b"])
def test_advise_names_serverless_answers_that_generate_a_valid_project(render, bundle_schema, model):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    advice = advise(job_from_args(parser.parse_args(["--model", model, "--cloud", "aws"])))
    answers = advice.serverless.template_answers("aws")
    project = render(**answers)
    assert errors_of(project, bundle_schema) == []
    count = int(answers["accelerator_count"])
    if model == "gpt2":
        assert (answers["accelerator_type"], count, answers["engine"]) == ("GPU_1xA10", 1, "torch_distributor")
    else:  # 7B and 70B parameters need ZeRO across the 80 GB H100s
        assert answers["accelerator_type"] == "GPU_8xH100" and count % 8 == 0 and answers["engine"] == "deepspeed"
