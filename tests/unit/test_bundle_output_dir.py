"""`validate` warns about a training job whose --output-dir holds no job run id: the project's run folder
(run_folder.py) resumes a failed run it finds there and reports a finished one's metrics instead of training, so every
run after the first would train nothing. The template's own jobs each train in `<volume>/<engine>/{{job.run_id}}`."""

from __future__ import annotations

import pytest
import yaml

from distributed_training.tooling.bundle.validate import validate_bundle
from support.rendering import render_template

RULE = "output-dir-shared-by-runs"
JOB = "resources/train_torch_distributor.job.yml"
WHERE = "resources.jobs.train_torch_distributor.tasks[0].python_wheel_task.parameters"
RUN_FOLDER = "/Volumes/${var.catalog}/${var.schema}/${resources.volumes.training.name}/torch_distributor/"


def warnings(project) -> list:
    """The rule's findings for the default target (prod names the same paths, with its own volume)."""
    return [finding for finding in validate_bundle(project)["dev"] if finding.rule == RULE]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return render_template(tmp_path_factory.mktemp("rendered"))


def edit_job(project, edit) -> None:
    document = yaml.safe_load((project / JOB).read_text())
    job = document["resources"]["jobs"]["train_torch_distributor"]
    edit(job, job["tasks"][0]["python_wheel_task"]["parameters"])
    (project / JOB).write_text(yaml.safe_dump(document, sort_keys=False))


@pytest.mark.parametrize("answers", [{"engine": "all"}, {"compute": "serverless_gpu", "engine": "deepspeed"}],
                         ids=["classic-all", "serverless"])
def test_the_templates_jobs_each_train_a_run_in_its_own_folder(tmp_path, answers):
    project = render_template(tmp_path, **answers)
    assert "--output-dir" in (project / "resources" / f"train_{answers['engine'].replace('all', 'ray')}.job.yml"
                              ).read_text()
    assert warnings(project) == []


def test_an_output_dir_without_the_job_run_id_is_named_with_the_fix(project):
    original = (project / JOB).read_text()
    try:
        edit_job(project, lambda job, parameters: parameters.__setitem__(
            parameters.index("--output-dir") + 1, RUN_FOLDER + "latest"))
        [warning] = warnings(project)
        index = yaml.safe_load((project / JOB).read_text())["resources"]["jobs"]["train_torch_distributor"][
            "tasks"][0]["python_wheel_task"]["parameters"].index("--output-dir") + 1
        assert (warning.severity, warning.path) == ("warning", f"{WHERE}[{index}]")
        assert warning.message.endswith(f"/torch_distributor/latest, which holds no job run id: the second run finds "
                                        "the first one's folder, and resumes it, or reports its metrics and trains "
                                        "nothing if it finished")
        assert warning.fix.startswith("end it with the job run id: append /{{job.run_id}} to its value")

        def one_argument(job, parameters):  # --output-dir=VALUE
            at = parameters.index("--output-dir")
            parameters[at:at + 2] = [f"--output-dir={RUN_FOLDER}latest"]
        edit_job(project, one_argument)
        assert [warning.path for warning in warnings(project)] == [f"{WHERE}[{index - 1}]"]
    finally:
        (project / JOB).write_text(original)


def test_the_job_run_id_through_a_job_parameters_default_is_enough(project):
    original = (project / JOB).read_text()
    try:
        def through_parameter(run_id_default):
            def edit(job, parameters):
                job["parameters"].append({"name": "folder", "default": run_id_default})
                parameters[parameters.index("--output-dir") + 1] = RUN_FOLDER + "{{job.parameters.folder}}"
            return edit
        edit_job(project, through_parameter("run-{{job.run_id}}"))
        assert warnings(project) == []
        (project / JOB).write_text(original)
        edit_job(project, through_parameter("shared"))
        assert len(warnings(project)) == 1
    finally:
        (project / JOB).write_text(original)
