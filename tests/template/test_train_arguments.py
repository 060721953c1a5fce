"""`validate` checks each job's `train` arguments against the project's own `train` (its task's options included),
and a serverless GPU task's environment against the torch it needs: both fail a run after deploy otherwise."""

from __future__ import annotations

import shutil

from distributed_training.compute.runtime import versions
from distributed_training.tooling.bundle.validate import validate_bundle

JOB = "resources/train_torch_distributor.job.yml"


def findings(project):
    """Every target's findings, once each (dev and prod share the jobs)."""
    return list(dict.fromkeys(finding for target in validate_bundle(project).values() for finding in target))


def add_arguments(project, *arguments):
    job = project / JOB
    added = "".join(f"              - {argument}\n" for argument in arguments)
    job.write_text(job.read_text().replace("              - --epochs\n", added + "              - --epochs\n"))


def test_a_task_option_is_accepted_while_the_task_has_it_and_named_once_task_py_no_longer_does(render):
    project = render(task="causal_lm")
    add_arguments(project, "--model-size", "small")
    assert [finding for finding in findings(project) if finding.is_error] == []
    shutil.copy(project / "examples" / "recurrent_language_model.py", project / "src" / "my_training" / "task.py")
    errors = {(finding.rule, finding.path, finding.message) for finding in findings(project) if finding.is_error}
    assert errors == {("unknown-train-option",
                       "resources.jobs.train_torch_distributor.tasks[0].python_wheel_task.parameters[8]",
                       "job train_torch_distributor passes --model-size to train, which this project's train does "
                       "not take (its task.py has no such option)")}


def test_the_fine_tuning_task_s_base_model_left_behind_by_another_task_py_is_named_with_its_variable(render):
    """The jobs of a fine_tune project pass --base-model ${var.base_model}; once task.py is the example, whose train
    takes no --base-model, the option and the variable that fills it are what to remove."""
    project = render(task="fine_tune")
    assert [finding for finding in findings(project) if finding.is_error] == []
    shutil.copy(project / "examples" / "recurrent_language_model.py", project / "src" / "my_training" / "task.py")
    [error] = [finding for finding in findings(project) if finding.is_error]
    assert (error.rule, error.path) == (
        "unknown-train-option", "resources.jobs.train_torch_distributor.tasks[0].python_wheel_task.parameters[4]")
    assert error.message == ("job train_torch_distributor passes --base-model to train, which this project's train "
                             "does not take (its task.py has no such option: the fine_tune task's, left behind)")
    assert error.fix.startswith("remove '--base-model' and its value from the job's parameters, and the bundle "
                                "variable base_model from databricks.yml")
    assert [finding.rule for finding in findings(project) if finding.rule == "empty-base-model"] == []


def test_an_engine_the_project_does_not_carry_and_a_task_that_does_not_import_are_named(render):
    project = render()
    job = project / JOB
    job.write_text(job.read_text().replace("              - torch_distributor\n", "              - ray\n", 1))
    [error] = [finding for finding in findings(project) if finding.is_error]
    assert error.rule == "unknown-train-engine" and "--engine ray, which this project does not carry" in error.message
    (project / "src" / "my_training" / "task.py").write_text("def broken(:\n")
    [warning] = {finding for finding in findings(project) if finding.rule == "train-options-unreadable"}
    assert not warning.is_error and "src/my_training does not import without torch (the task module" in warning.message
    assert "task.py, line 1: SyntaxError: invalid syntax" in warning.message


def test_a_serverless_environment_without_torch_in_its_base_must_list_it(render):
    project = render(compute="serverless_gpu", engine="deepspeed")
    assert [finding for finding in findings(project) if finding.is_error] == []  # version 4: torch in its base
    job = project / "resources" / "train_deepspeed.job.yml"
    job.write_text(job.read_text().replace('environment_version: "4"', 'environment_version: "5"'))
    errors = {finding.rule for finding in findings(project) if finding.is_error}
    assert errors == {"serverless-environment-without-torch"}
    pinned = versions()["packages"]
    deepspeed, torch = (f"              - {name}=={pinned[name]}\n" for name in ("deepspeed", "torch"))
    job.write_text(job.read_text().replace(deepspeed, deepspeed + torch))
    assert [finding for finding in findings(project) if finding.is_error] == []
