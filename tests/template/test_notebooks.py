"""A generated notebook runs what its deployed job runs: it reads the job the bundle deployed for its target (the id
from the deploy's metadata.json in the state folder, the arguments from the Jobs API) rather than re-deriving the
CLI's names, whether the deploy copied the notebook to the bundle's root path (from a laptop) or left it in its Git
folder (a source-linked dev deploy from the workspace: Databricks CLI v1.13.0,
bundle/config/mutator/apply_source_linked_deployment_preset.go; the metadata's workspace.file_path is then the
folder deployed from, bundle/deploy/metadata/compute.go). Each run of a notebook trains in a folder of its own, as
each job run does; resuming one is asked for. Run here with a stand-in `dbutils`, the workspace's files under a
folder, and the Jobs API of a FakeWorkspace (real databricks-sdk over HTTP); `train` itself is replaced by a
recorder."""

from __future__ import annotations

import builtins
import json
import re
import sys
import types

import pytest
import yaml

from support.fake_workspace import DUMMY_TOKEN, FakeWorkspace

# A user whose name the CLI's short-name rules keep Unicode letters of, so no notebook could re-derive the volume.
USER = "jürgen.müller@example.com"
ROOT = f"/Users/{USER}/.bundle/my-training/dev"  # the dev target's default root path
GIT_FOLDER = f"/Users/{USER}/projects/my-training"  # a Git folder in the workspace, deployed from there
VOLUME = "/Volumes/main/default/dev_jürgen_müller_my_training_training"


class FakeWidgets:
    def __init__(self):
        self.values = {}

    def text(self, name, default, label=""):
        self.values.setdefault(name, default)  # as Databricks' widgets: a value set earlier stays

    def get(self, name):
        return self.values[name]


def fake_dbutils(notebook_path: str):
    context = types.SimpleNamespace(notebookPath=lambda: types.SimpleNamespace(get=lambda: notebook_path))
    entry_point = types.SimpleNamespace(getDbutils=lambda: types.SimpleNamespace(
        notebook=lambda: types.SimpleNamespace(getContext=lambda: context)))
    return types.SimpleNamespace(widgets=FakeWidgets(), library=types.SimpleNamespace(restartPython=lambda: None),
                                 notebook=types.SimpleNamespace(entry_point=entry_point))


def deployed_job_parameters(project) -> list[str]:
    [job] = yaml.safe_load((project / "resources" / "train_torch_distributor.job.yml").read_text())[
        "resources"]["jobs"].values()
    return [parameter.replace("${var.training_table}", "main.sales.comments").replace(
        "/Volumes/${var.catalog}/${var.schema}/${resources.volumes.training.name}", VOLUME).replace(
        "${workspace.root_path}", f"/Workspace{ROOT}") for parameter in job["tasks"][0]["python_wheel_task"]["parameters"]]


@pytest.fixture
def notebook_runs(rendered, tmp_path, monkeypatch):
    """run(notebook_path, deployed_from, widgets=None) -> the argv the notebook gave `train`, with this deployment:
    its metadata.json at the dev root, deployed from `deployed_from`, its job in the Jobs API."""
    project = rendered()
    calls = []
    launch = types.ModuleType("my_training.launch")
    launch.main = lambda argv: calls.append(argv) or 0
    monkeypatch.setitem(sys.modules, "my_training", types.ModuleType("my_training"))
    monkeypatch.setitem(sys.modules, "my_training.launch", launch)
    workspace_file = lambda path: str(tmp_path / path.lstrip("/")) if path.startswith("/Workspace/") else path  # noqa
    source = (project / "notebooks" / "train_torch_distributor.py").read_text()

    def run(notebook_path: str, deployed_from: str, widgets: dict | None = None) -> dict:
        state = tmp_path / "Workspace" / ROOT.lstrip("/") / "state"
        state.mkdir(parents=True, exist_ok=True)
        (state / "metadata.json").write_text(json.dumps({"version": 1, "config": {
            "workspace": {"file_path": deployed_from},
            "resources": {"jobs": {"train_torch_distributor": {"id": "4242"}}}}}))
        dbutils = fake_dbutils(notebook_path)
        dbutils.widgets.values.update(widgets or {})
        with FakeWorkspace(user=USER) as fake:
            fake.add_job(4242, "[dev jürgen_müller] my-training-torch-distributor")
            fake.jobs[4242]["settings"].update(parameters=[{"name": "epochs", "default": "7"}], tasks=[
                {"task_key": "train", "python_wheel_task": {"package_name": "my_training", "entry_point": "train",
                                                            "parameters": deployed_job_parameters(project)}}])
            monkeypatch.setenv("DATABRICKS_HOST", fake.url)
            monkeypatch.setenv("DATABRICKS_TOKEN", DUMMY_TOKEN)
            exec(compile(source, "train_torch_distributor.py", "exec"), {
                "__name__": "__main__", "dbutils": dbutils,
                "open": lambda path, *args, **kwargs: builtins.open(workspace_file(path), *args, **kwargs)})
        argv = calls.pop()
        return dict(zip(argv[::2], argv[1::2]))

    return run


@pytest.mark.parametrize("notebook, deployed_from", [
    (f"{ROOT}/files/notebooks/train_torch_distributor", f"/Workspace{ROOT}/files"),  # copied by a deploy
    (f"{GIT_FOLDER}/notebooks/train_torch_distributor", f"/Workspace{GIT_FOLDER}"),  # source-linked
], ids=["deployed-copy", "source-linked"])
def test_a_notebook_trains_with_the_deployed_jobs_table_volume_epochs_and_experiment(notebook_runs, notebook,
                                                                                     deployed_from):
    given = notebook_runs(notebook, deployed_from)
    assert given["--table"] == "main.sales.comments"
    assert re.fullmatch(f"{VOLUME}/torch_distributor/notebook-\\d{{8}}-\\d{{6}}-[0-9a-f]{{6}}", given["--output-dir"])
    assert given["--epochs"] == "7" and given["--mlflow-experiment"] == f"/Workspace{ROOT}/my-training-torch_distributor"
    assert "--job-run-id" not in given  # a notebook run is no job run


def test_each_run_of_a_notebook_trains_in_a_folder_of_its_own_and_resumes_only_when_asked(notebook_runs):
    notebook, deployed_from = f"{GIT_FOLDER}/notebooks/train_torch_distributor", f"/Workspace{GIT_FOLDER}"
    first, second = (notebook_runs(notebook, deployed_from)["--output-dir"] for _ in range(2))
    assert first != second and first.rsplit("/", 1)[0] == second.rsplit("/", 1)[0] == f"{VOLUME}/torch_distributor"
    assert notebook_runs(notebook, deployed_from, {"resume_from": first})["--output-dir"] == first


def test_a_notebook_refuses_a_deployment_made_from_another_folder_or_none(notebook_runs):
    other = f"/Users/{USER}/elsewhere/my-training/notebooks/train_torch_distributor"
    with pytest.raises(RuntimeError, match=f"runs the files in /Workspace{GIT_FOLDER}, not this notebook's: deploy "
                                           "from this notebook's folder first"):
        notebook_runs(other, f"/Workspace{GIT_FOLDER}")
    with pytest.raises(RuntimeError, match=r"no deployment of this bundle at /Workspace/Users/nobody@example.com/"
                                           r"\.bundle/my-training/prod: deploy it first"):
        notebook_runs("/Users/nobody@example.com/.bundle/my-training/prod/files/notebooks/train_torch_distributor",
                      f"/Workspace{ROOT}/files")
