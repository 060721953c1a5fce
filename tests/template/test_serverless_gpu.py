"""compute=serverless_gpu: a serverless task stages the data and plans the run, an `ai_runtime_task` runs the loop
under torchrun through the project's own src/command.sh.

Rendered projects for every engine that runs there, on every accelerator, validate against the CLI's schema and the
typed classes; the answers that cannot work there are refused with the rule and nothing is written; hand edits are
caught by `validate`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cookiecutter.exceptions import FailedHookException

from distributed_training.compute.runtime import versions
from distributed_training.tooling.advise.command import add_arguments, job_from_args
from distributed_training.tooling.advise.search import advise
from distributed_training.tooling.bundle.validate import validate_bundle
from distributed_training.tooling.serverless import ACCELERATORS, SERVERLESS_ENGINES

COMMAND_PATH = "${workspace.file_path}/src/command.sh"
PINNED = versions()["packages"]


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
def test_serverless_projects_validate_and_hand_the_run_to_torchrun(rendered, bundle_schema, engine, accelerator_type,
                                                                   accelerator_count):
    project = rendered(compute="serverless_gpu", engine=engine, accelerator_type=accelerator_type,
                       accelerator_count=accelerator_count)
    assert errors_of(project, bundle_schema) == []
    assert sorted(path.name for path in (project / "resources").glob("*.job.yml")) == [f"train_{engine}.job.yml"]
    assert not (project / "notebooks").exists()  # a notebook cannot run what the ai_runtime_task runs
    job = job_of(project, engine)
    assert "job_clusters" not in job and job["tags"]["compute"] == "serverless_gpu"
    stage, train = job["tasks"]
    assert (stage["task_key"], train["task_key"]) == ("stage", "train")
    parameters = stage["python_wheel_task"]["parameters"]
    assert "--handoff-to-torchrun" in parameters and option(parameters, "--engine") == engine
    per_node = ACCELERATORS[accelerator_type].gpus_per_node
    assert option(parameters, "--gpus-per-node") == str(per_node)
    assert option(parameters, "--num-nodes") == str(accelerator_count // per_node)
    assert train["depends_on"] == [{"task_key": "stage"}]
    gpu_task = train["ai_runtime_task"]
    # The stage task names the run's config in the experiment the GPU task's MLflow run belongs to.
    assert option(parameters, "--mlflow-experiment") == (
        f"{gpu_task['mlflow_experiment_directory']}/{gpu_task['experiment']}") == (
        f"${{workspace.root_path}}/my-training-{engine}")
    # The nodes get the project's source folder (the CLI reads code_source_path from the bundle root) ...
    assert gpu_task["code_source_path"] == "src" and (project / "src").is_dir()
    assert (project / "src" / stage["python_wheel_task"]["package_name"] / "engines" / "torchrun.py").is_file()
    # ... and run the project's own command, a synced file of the bundle.
    (deployment,) = gpu_task["deployments"]
    assert deployment["command_path"] == COMMAND_PATH
    assert deployment["compute"] == {"accelerator_type": accelerator_type, "accelerator_count": accelerator_count}
    command = project / "src" / "command.sh"
    assert command.is_file() and os.access(command, os.X_OK)
    assert command.read_text().rstrip().endswith("exec python -m my_training.engines.torchrun")
    environments = {environment["environment_key"]: environment["spec"] for environment in job["environments"]}
    assert (stage["environment_key"], train["environment_key"]) == ("staging", "training")
    assert set(environments) == {"staging", "training"}
    for spec in environments.values():
        assert spec["environment_version"] == versions()["serverless"]["environment_version"]
        assert spec["dependencies"][:2] == ["../dist/*.whl", f"mlflow-skinny=={PINNED['mlflow-skinny']}"]
    deepspeed = f"deepspeed=={PINNED['deepspeed']}"  # the versions the tests ran (tests/template/test_pinned_versions.py)
    assert deepspeed not in environments["staging"]["dependencies"]  # the stage task has no torch
    assert (deepspeed in environments["training"]["dependencies"]) == (engine == "deepspeed")


@pytest.mark.parametrize("task", ["fare_regression", "causal_lm"])
def test_the_command_runs_the_torchrun_module_from_the_code_source_path(rendered, tmp_path, task):
    """What a node does: CODE_SOURCE_PATH is the unpacked src/, and the command imports the package from it alone
    (no wheel installed, another working folder). With no MLflow run to name the config, the module says so.
    A name of its own: no package of that name is installed here."""
    project = rendered(compute="serverless_gpu", task=task, project_name="Node Probe")
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "MLFLOW_RUN_ID")}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"  # `python`: this one
    command = ["bash", str(project / "src" / "command.sh")]

    without = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)
    assert without.returncode != 0 and "No module named 'node_probe'" in without.stderr, without.stderr

    environment["CODE_SOURCE_PATH"] = str(project / "src")
    ran = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "MLFLOW_RUN_ID is not set" in ran.stderr, ran.stderr


@pytest.mark.parametrize("engine, blocked", [("deepspeed", "deepspeed"), ("deepspeed", "mlflow"),
                                             ("torch_distributor", "torch"), ("torch_distributor", "deepspeed")])
def test_the_command_names_a_module_the_node_lacks_and_the_requirement_that_installs_it(rendered, tmp_path, engine,
                                                                                        blocked):
    """Before torchrun: a module the engine's loop imports that this node's environment lacks is named as missing (a
    None in sys.modules, as a sitecustomize on PYTHONPATH leaves it, is a module import cannot find), not left to a
    later step's message; a module the engine does not import is not asked for."""
    project = rendered(compute="serverless_gpu", engine=engine)
    (tmp_path / "sitecustomize.py").write_text(f"import sys\nsys.modules[{blocked!r}] = None\n")
    environment = {key: value for key, value in os.environ.items() if key != "MLFLOW_RUN_ID"}
    environment.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}", PYTHONPATH=str(tmp_path),
                       CODE_SOURCE_PATH=str(project / "src"))
    ran = subprocess.run(["bash", str(project / "src" / "command.sh")], cwd=tmp_path, env=environment,
                         capture_output=True, text=True, timeout=120)
    requirements = {"torch": f"torch=={PINNED['torch']}", "mlflow": f"mlflow-skinny=={PINNED['mlflow-skinny']}",
                    "deepspeed": f"deepspeed=={PINNED['deepspeed']}"}
    if blocked == "deepspeed" and engine != "deepspeed":
        assert ran.returncode == 2 and "MLFLOW_RUN_ID is not set" in ran.stderr, ran.stderr  # on to the module
        return
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert ran.stderr.strip() == (f"error: the module {blocked} is not installed on this node: add "
                                  f"{requirements[blocked]} to the dependencies of the training environment in "
                                  f"resources/train_{engine}.job.yml")
    job = job_of(project, engine)
    [training] = [environment for environment in job["environments"] if environment["environment_key"] == "training"]
    if blocked != "torch":  # the environment's base has torch (version 4): what it adds, the fix names
        assert requirements[blocked] in training["spec"]["dependencies"]


def test_serverless_projects_have_no_notebooks_and_classic_ones_no_command(rendered):
    serverless, classic = rendered(compute="serverless_gpu"), rendered()
    assert (serverless / "src" / "command.sh").is_file() and not (serverless / "notebooks").exists()
    assert not (classic / "src" / "command.sh").exists() and (classic / "notebooks").is_dir()


def test_a_multi_node_serverless_run_is_a_warning_that_names_the_nodes(rendered):
    project = rendered(compute="serverless_gpu", accelerator_type="GPU_1xA10", accelerator_count=4)
    findings = validate_bundle(project, targets=["dev"])["dev"]
    assert [finding for finding in findings if finding.is_error] == []
    (warning,) = [finding for finding in findings if finding.rule == "serverless-gpu-single-gpu-nodes"]
    assert "4 nodes of one GPU each" in warning.message and "GPU_8xH100" in warning.fix


@pytest.mark.parametrize("answers, rule, words", [
    ({"engine": "ray"}, "serverless-gpu-engine", "ray"),
    ({"engine": "spark_ml_connect"}, "serverless-gpu-engine", "spark_ml_connect"),
    ({"engine": "all"}, "serverless-gpu-engine", "one job per engine"),
    ({"accelerator_type": "GPU_8xH100", "accelerator_count": "12"}, "serverless-gpu-accelerator-count",
     "not a positive multiple of 8"),
    ({"accelerator_count": "0"}, "serverless-gpu-accelerator-count", "not a positive multiple of 1"),
    ({"accelerator_count": "two"}, "invalid-accelerator-count", "'two'"),
    ({"num_workers": "2"}, "mixed-compute-answers", "num_workers '2' is a classic cluster setting"),
    ({"node_type_id": "Standard_NC24ads_A100_v4"}, "mixed-compute-answers", "answer compute=classic"),
    ({"spark_version": "16.4.x-scala2.12"}, "mixed-compute-answers", "spark_version"),
])
def test_answers_that_cannot_run_on_serverless_gpu_are_refused(render, tmp_path, capfd, answers, rule, words):
    with pytest.raises(FailedHookException):
        render(tmp_path, compute="serverless_gpu", **answers)
    assert list(tmp_path.iterdir()) == []
    stderr = capfd.readouterr().err
    assert f"[{rule}]" in stderr and words in stderr and "Nothing was generated" in stderr, stderr


@pytest.mark.parametrize("answers, words", [
    ({"accelerator_type": "GPU_8xH100"}, "accelerator_type 'GPU_8xH100' is a serverless GPU setting"),
    ({"accelerator_count": "4"}, "answer compute=serverless_gpu"),
])
def test_serverless_answers_on_classic_compute_are_refused(render, tmp_path, capfd, answers, words):
    with pytest.raises(FailedHookException):
        render(tmp_path, **answers)
    assert list(tmp_path.iterdir()) == []
    stderr = capfd.readouterr().err
    assert "[mixed-compute-answers]" in stderr and words in stderr, stderr


def test_an_unknown_compute_is_refused_by_the_answer_checks():
    """Cookiecutter refuses a value outside a choice list itself; the hook's checks serve other callers too."""
    from distributed_training.tooling.answers import check_answers

    answers = {"project_name": "P", "project_slug": "p", "package_name": "p", "cloud": "aws",
               "engine": "torch_distributor", "compute": "gpu", "num_workers": "0", "catalog": "main",
               "schema": "default"}
    (finding,) = check_answers(answers)
    assert finding.rule == "invalid-compute" and "classic or serverless_gpu" in finding.fix


def edit_job(project, engine, edit):
    path = project / "resources" / f"train_{engine}.job.yml"
    tree = yaml.safe_load(path.read_text())
    edit(tree["resources"]["jobs"][f"train_{engine}"])
    path.write_text(yaml.safe_dump(tree, sort_keys=False))


def gpu_task(job):
    return job["tasks"][1]["ai_runtime_task"]


@pytest.mark.parametrize("edit, rule", [
    (lambda job: job["tasks"][1].update(job_cluster_key="training"), "mixed-compute"),
    (lambda job: gpu_task(job)["deployments"].append(gpu_task(job)["deployments"][0]), "serverless-gpu-deployments"),
    (lambda job: gpu_task(job)["deployments"][0]["compute"].update(accelerator_type="GPU_8xH100",
                                                                   accelerator_count=12),
     "serverless-gpu-accelerator-count"),
    (lambda job: gpu_task(job)["deployments"][0]["compute"].update(accelerator_type="GPU_4xA100"),
     "serverless-gpu-accelerator-type"),
    (lambda job: job["tasks"][0]["python_wheel_task"]["parameters"].__setitem__(1, "ray"), "serverless-gpu-engine"),
    (lambda job: gpu_task(job).update(code_source_path="source"), "code-source-missing"),
    (lambda job: gpu_task(job).update(code_source_path="../src"), "code-source-outside-bundle"),
    (lambda job: gpu_task(job)["deployments"][0].update(command_path="${workspace.file_path}/src/run.sh"),
     "command-file-missing"),
    (lambda job: gpu_task(job)["deployments"][0].update(command_path="command.sh"), "local-path-missing"),
])
def test_validate_catches_hand_edits_of_a_serverless_job(render, edit, rule):
    project = render(compute="serverless_gpu")
    assert errors_of(project, None) == []
    edit_job(project, "torch_distributor", edit)
    findings = validate_bundle(project, targets=["dev"])["dev"]
    assert rule in {finding.rule for finding in findings if finding.is_error}, [str(f) for f in findings]


def test_a_relative_command_path_from_the_job_file_names_the_same_script(render):
    """The CLI reads a local command_path from the YAML file's folder: ../src/command.sh from resources/."""
    project = render(compute="serverless_gpu")
    edit_job(project, "torch_distributor",
             lambda job: gpu_task(job)["deployments"][0].update(command_path="../src/command.sh"))
    assert errors_of(project, None) == []


def test_a_command_path_outside_the_workspace_is_a_warning_with_the_fix(render):
    project = render(compute="serverless_gpu")
    edit_job(project, "torch_distributor", lambda job: gpu_task(job)["deployments"][0]
             .update(command_path="/Volumes/main/default/training/torchrun/command.sh"))
    (finding,) = [f for f in validate_bundle(project, targets=["dev"])["dev"] if f.rule == "serverless-gpu-command-path"]
    assert finding.severity == "warning" and "/Volumes/main/default/training" in finding.message
    assert "src/command.sh" in finding.fix and finding.path.endswith("deployments[0].command_path")


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
