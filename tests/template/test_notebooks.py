"""A generated notebook runs what its deployed job runs: it reads the job the bundle deployed for its target (the id
from the deploy's metadata.json in the state folder, the arguments from the Jobs API) rather than re-deriving the
CLI's names. Run here with a stand-in `dbutils`, the workspace's files under a folder, and the Jobs API of a
FakeWorkspace (real databricks-sdk over HTTP); `train` itself is replaced by a recorder."""

from __future__ import annotations

import builtins
import json
import sys
import types

import yaml

from support.fake_workspace import DUMMY_TOKEN, FakeWorkspace

# A user whose name the CLI's short-name rules keep Unicode letters of, so no notebook could re-derive the volume.
ROOT = "/Users/jürgen.müller@example.com/.bundle/my-training/dev"
VOLUME = "/Volumes/main/default/dev_jürgen_müller_my_training_training"


class FakeWidgets:
    def __init__(self):
        self.values = {}

    def text(self, name, default, label=""):
        self.values.setdefault(name, default)

    def get(self, name):
        return self.values[name]


def fake_dbutils(notebook_path: str):
    context = types.SimpleNamespace(notebookPath=lambda: types.SimpleNamespace(get=lambda: notebook_path))
    entry_point = types.SimpleNamespace(getDbutils=lambda: types.SimpleNamespace(
        notebook=lambda: types.SimpleNamespace(getContext=lambda: context)))
    return types.SimpleNamespace(widgets=FakeWidgets(), library=types.SimpleNamespace(restartPython=lambda: None),
                                 notebook=types.SimpleNamespace(entry_point=entry_point))


def test_a_notebook_trains_with_the_deployed_jobs_table_folder_epochs_and_experiment(rendered, tmp_path,
                                                                                        monkeypatch):
    project = rendered()
    [job] = yaml.safe_load((project / "resources" / "train_torch_distributor.job.yml").read_text())[
        "resources"]["jobs"].values()
    parameters = [parameter.replace("${var.training_table}", "main.sales.comments").replace(
        "/Volumes/${var.catalog}/${var.schema}/${resources.volumes.training.name}", VOLUME).replace(
        "${workspace.root_path}", f"/Workspace{ROOT}") for parameter in job["tasks"][0]["python_wheel_task"]["parameters"]]
    state = tmp_path / "Workspace" / ROOT.lstrip("/") / "state"
    state.mkdir(parents=True)
    (state / "metadata.json").write_text(json.dumps(
        {"version": 1, "config": {"resources": {"jobs": {"train_torch_distributor": {"id": "4242"}}}}}))
    workspace_file = lambda path: str(tmp_path / path.lstrip("/")) if path.startswith("/Workspace/") else path  # noqa
    calls = []
    launch = types.ModuleType("my_training.launch")
    launch.main = lambda argv: calls.append(argv) or 0
    monkeypatch.setitem(sys.modules, "my_training", types.ModuleType("my_training"))
    monkeypatch.setitem(sys.modules, "my_training.launch", launch)
    with FakeWorkspace() as fake:
        fake.add_job(4242, "[dev jürgen_müller] my-training-torch-distributor")
        fake.jobs[4242]["settings"].update(parameters=[{"name": "epochs", "default": "7"}], tasks=[
            {"task_key": "train", "python_wheel_task": {"package_name": "my_training", "entry_point": "train",
                                                        "parameters": parameters}}])
        monkeypatch.setenv("DATABRICKS_HOST", fake.url)
        monkeypatch.setenv("DATABRICKS_TOKEN", DUMMY_TOKEN)
        source = (project / "notebooks" / "train_torch_distributor.py").read_text()
        exec(compile(source, "train_torch_distributor.py", "exec"), {
            "__name__": "__main__", "dbutils": fake_dbutils(f"{ROOT}/files/notebooks/train_torch_distributor"),
            "open": lambda path, *args, **kwargs: builtins.open(workspace_file(path), *args, **kwargs)})
    [argv] = calls
    given = dict(zip(argv[::2], argv[1::2]))
    assert given["--table"] == "main.sales.comments"
    assert given["--output-dir"] == f"{VOLUME}/torch_distributor/notebook"
    assert given["--epochs"] == "7" and given["--mlflow-experiment"] == f"/Workspace{ROOT}/my-training-torch_distributor"
    assert "--job-run-id" not in given  # a notebook run is no job run
