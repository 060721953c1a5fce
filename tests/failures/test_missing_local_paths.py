"""The failure matrix of `validate` on the local paths the Databricks CLI resolves (issue 24): notebooks, files and
directories that are missing, of the wrong kind, or outside the folders the CLI syncs, and the paths it leaves alone.

Each case edits a copy of the good bundle (beside it: a few project files, and a folder `shared/` outside it), runs
the command line (`validate BUNDLE`) in process, and asserts the exit code and the one error line: its file, its YAML
path, its rule, the path from the bundle root that is missing (or wrong), and words of its fix, under the target it
holds for. Each case names the CLI source (github.com/databricks/cli at v1.13.0, bundle/config/mutator/ unless
said) and the line it follows.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from distributed_training.tooling.cli import main

GOOD = Path(__file__).resolve().parents[1] / "fixtures" / "bundles" / "good"
ROOT_FILE, PATHS_FILE = "databricks.yml", "resources/paths.job.yml"
TASK = "resources.jobs.paths.tasks[0]"
SCHEMA_ENV = "DATABRICKS_BUNDLE_SCHEMA"
NOTEBOOK = "# Databricks notebook source\nprint('train')\n"
PROJECT_FILES = {  # beside databricks.yml; "shared/" lies next to the bundle's folder, outside it
    "bundle/notebooks/train.py": NOTEBOOK,
    "bundle/notebooks/plain.py": "print('a plain Python file')\n",
    "bundle/notebooks/folder/.keep": "",
    "bundle/src/job.py": "print('a Python file task')\n",
    "bundle/queries/report.sql": "SELECT 1\n",
    "bundle/dbt/dbt_project.yml": "name: report\n",
    "bundle/requirements.txt": "numpy\n",
    "bundle/app/app.py": "print('app')\n",
    "shared/helper.py": NOTEBOOK,
    "shared/requirements.txt": "numpy\n",
}


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Path], None]  # edits the copy of the good bundle
    source: str  # the CLI source file and line the case follows
    code: int = 1  # 0: no error (the CLI leaves the path alone, or accepts it)
    rule: str = "local-path-missing"
    names: str = ""  # the path from the bundle root the message names
    fix: str = ""  # words of the fix
    path: str = f"{TASK}.notebook_task.notebook_path"
    file: str = PATHS_FILE
    target: str | None = None  # the one target the error holds for; None: every target


def _write_yaml(bundle: Path, name: str, document: dict) -> None:
    (bundle / name).write_text(yaml.safe_dump(document, sort_keys=False))


def _resources(file: str = PATHS_FILE, **resources) -> Callable[[Path], None]:
    return lambda bundle: _write_yaml(bundle, file, {"resources": resources})


def _task(**fields) -> Callable[[Path], None]:
    """Job `paths` in resources/paths.job.yml, with one task of `fields` on an existing cluster (None: without)."""
    task = {key: value for key, value in {"task_key": "t", "existing_cluster_id": "abc", **fields}.items()
            if value is not None}
    return _resources(jobs={"paths": {"name": "paths", "tasks": [task]}})


def _notebook(path: str) -> Callable[[Path], None]:
    return _task(notebook_task={"notebook_path": path})


def _python_file(path: str) -> Callable[[Path], None]:
    return _task(spark_python_task={"python_file": path})


def _pipeline(**fields) -> Callable[[Path], None]:
    return _resources(pipelines={"p": {"name": "p", **fields}})


def _environment_dependency(dependency: str) -> Callable[[Path], None]:
    return _resources(jobs={"paths": {"name": "paths", "environments": [
        {"environment_key": "e", "spec": {"environment_version": "4", "dependencies": [dependency]}}],
        "tasks": [{"task_key": "t", "environment_key": "e", "spark_python_task": {"python_file": "../src/job.py"}}]}})


def _edit_root(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def make(bundle: Path) -> None:
        document = yaml.safe_load((bundle / ROOT_FILE).read_text())
        edit(document)
        _write_yaml(bundle, ROOT_FILE, document)
    return make


def _both(*makes: Callable[[Path], None]) -> Callable[[Path], None]:
    def make(bundle: Path) -> None:
        for each in makes:
            each(bundle)
    return make


def _artifact_path(path: str) -> Callable[[Path], None]:
    return _edit_root(lambda document: document["artifacts"]["default"].update(path=path))


def _variable_notebook(default: str) -> Callable[[Path], None]:
    return _both(_edit_root(lambda document: document["variables"].update(notebook={"default": default})),
                 _notebook("${var.notebook}"))


def _prod_notebook(path: str) -> Callable[[Path], None]:
    """The prod target overrides the task's notebook (from databricks.yml, so relative to the bundle root)."""
    override = {"resources": {"jobs": {"paths": {"tasks": [
        {"task_key": "t", "notebook_task": {"notebook_path": path}}]}}}}
    return _both(_notebook("../notebooks/train.py"),
                 _edit_root(lambda document: document["targets"]["prod"].update(override)))


def _sync_parent(bundle: Path) -> None:
    _edit_root(lambda document: document.update(sync={"paths": ["..", "."]}))(bundle)


NOTEBOOK_EXTENSIONS = "(.py, .r, .scala, .sql, .ipynb)"
CASES = [
    # notebooks: translate_paths.go:197 translateNotebookPath
    Case("notebook missing", _notebook("../notebooks/gone.py"), 'translate_paths.go:205 "notebook %s not found"',
         names="notebooks/gone.py", fix="create notebooks/gone.py, or correct the path: the CLI reads it from "
         "resources/, the folder of the file setting it"),
    Case("notebook without its extension", _notebook("../notebooks/train"),
         'translate_paths.go:214 "notebook %q not found. Did you mean %q?"', names="notebooks/train",
         fix=f'did you mean "../notebooks/train.py"? Local notebook references carry their extension '
             f"{NOTEBOOK_EXTENSIONS}"),
    Case("notebook without an extension, no file with one", _notebook("../notebooks/gone"),
         'translate_paths.go:221 "notebook %q not found. Local notebook references are expected"',
         names="notebooks/gone", fix="create notebooks/gone"),
    Case("notebook relative to the bundle root, not to its file", _notebook("notebooks/train.py"),
         "normalize_paths.go:124 (relative to the folder of the file that sets it)",
         names="resources/notebooks/train.py", fix="the CLI reads it from resources/,"),
    Case("notebook names a directory", _notebook("../notebooks/folder"),
         'translate_paths.go:225 "unable to determine if %s is a notebook" (reading a directory fails)',
         rule="local-path-wrong-kind", names="the directory notebooks/folder", fix="name a notebook inside it"),
    Case("notebook names a plain Python file", _notebook("../notebooks/plain.py"),
         'translate_paths.go:227 ErrIsNotNotebook "expected a notebook for %s but got a file"',
         rule="local-path-wrong-kind", names="notebooks/plain.py, which is not a notebook",
         fix='its first line must be "# Databricks notebook source"'),
    Case("notebook inside a for_each_task missing",
         _task(for_each_task={"inputs": "[1, 2]", "task": {
             "task_key": "inner", "existing_cluster_id": "abc",
             "notebook_task": {"notebook_path": "../notebooks/gone.py"}}}),
         "paths/job_paths_visitor.go:71 (the for_each_task's task)", names="notebooks/gone.py",
         path=f"{TASK}.for_each_task.task.notebook_task.notebook_path", fix="create notebooks/gone.py"),
    # files: translate_paths.go:236 translateFilePath
    Case("python_file missing", _python_file("../src/gone.py"), 'translate_paths.go:243 "file %s not found"',
         names="src/gone.py", path=f"{TASK}.spark_python_task.python_file", fix="create src/gone.py"),
    Case("python_file names a directory", _python_file("../src"),
         'translate_paths.go:246 "unable to determine if %s is not a notebook" (reading a directory fails)',
         rule="local-path-wrong-kind", names="the directory src", path=f"{TASK}.spark_python_task.python_file",
         fix="name a file inside it"),
    Case("python_file names a notebook", _python_file("../notebooks/train.py"),
         'translate_paths.go:248 ErrIsNotebook "expected a file for %s but got a notebook"',
         rule="local-path-wrong-kind", names="notebooks/train.py, a notebook",
         path=f"{TASK}.spark_python_task.python_file", fix="run it with a notebook_task"),
    Case("sql_task file missing", _task(sql_task={"warehouse_id": "w", "file": {"path": "../queries/gone.sql"}}),
         "paths/job_paths_visitor.go:35, translate_paths.go:243", names="queries/gone.sql",
         path=f"{TASK}.sql_task.file.path", fix="create queries/gone.sql"),
    Case("requirements library missing", _task(spark_python_task={"python_file": "../src/job.py"},
                                               libraries=[{"requirements": "../requirements-gone.txt"}]),
         "paths/job_paths_visitor.go:45, translate_paths.go:243", names="requirements-gone.txt",
         path=f"{TASK}.libraries[0].requirements", fix="create requirements-gone.txt"),
    Case("environment dependency -r file missing", _environment_dependency("-r ../requirements-gone.txt"),
         "paths/job_libraries_paths_visitor.go:65, translate_paths.go:182", names="requirements-gone.txt",
         path="resources.jobs.paths.environments[0].spec.dependencies[0]", fix="create requirements-gone.txt"),
    # directories: translate_paths.go:254 translateDirectoryPath
    Case("dbt project directory missing",
         _task(dbt_task={"project_directory": "../dbt_gone", "commands": ["dbt run"]}),
         "paths/job_paths_visitor.go:30, translate_paths.go:259 (stat fails)", names="dbt_gone",
         path=f"{TASK}.dbt_task.project_directory", fix="create dbt_gone"),
    Case("dbt project directory names a file",
         _task(dbt_task={"project_directory": "../dbt/dbt_project.yml", "commands": ["dbt run"]}),
         'translate_paths.go:264 "%s is not a directory"', rule="local-path-wrong-kind",
         names="the file dbt/dbt_project.yml", path=f"{TASK}.dbt_task.project_directory",
         fix="name a directory, e.g. ../dbt,"),
    Case("app source code missing", _resources(apps={"a": {"name": "a", "source_code_path": "../app_gone"}}),
         "paths/app_paths_visitor.go:16, translate_paths.go:259", names="app_gone",
         path="resources.apps.a.source_code_path", fix="create app_gone"),
    # pipelines: paths/pipeline_paths_visitor.go
    Case("pipeline notebook missing", _pipeline(libraries=[{"notebook": {"path": "../notebooks/gone.py"}}]),
         "paths/pipeline_paths_visitor.go:28, translate_paths.go:205", names="notebooks/gone.py",
         path="resources.pipelines.p.libraries[0].notebook.path", fix="create notebooks/gone.py"),
    Case("pipeline file missing", _pipeline(libraries=[{"file": {"path": "../src/gone.py"}}]),
         "paths/pipeline_paths_visitor.go:33, translate_paths.go:243", names="src/gone.py",
         path="resources.pipelines.p.libraries[0].file.path", fix="create src/gone.py"),
    Case("pipeline root_path names a file", _pipeline(root_path="../src/job.py"),
         'paths/pipeline_paths_visitor.go:43, translate_paths.go:264 "%s is not a directory"',
         rule="local-path-wrong-kind", names="the file src/job.py", path="resources.pipelines.p.root_path",
         fix="name a directory, e.g. ../src,"),
    Case("pipeline glob outside the bundle", _pipeline(libraries=[{"glob": {"include": "../../shared/**"}}]),
         'translate_paths.go:157 "path %s is not contained in sync root path" (the glob itself: :269)',
         rule="local-path-outside-sync-root", names="../shared/**",
         path="resources.pipelines.p.libraries[0].glob.include", fix="widen the sync root with sync.paths"),
    Case("pipeline glob that matches nothing", _pipeline(libraries=[{"glob": {"include": "../transformations/**"}}]),
         'translate_paths.go:269 translateGlobPath: no check', code=0),
    # artifacts: translate_paths.go:273 translateLocalAbsoluteDirectoryPath, allowed outside the sync root
    Case("artifact path missing", _artifact_path("build"), 'translate_paths.go:280 "directory %s not found"',
         names="build", path="artifacts.default.path", file=ROOT_FILE, fix="create build"),
    Case("artifact path names a file", _artifact_path("requirements.txt"),
         'translate_paths.go:286 "expected %s to be a directory but found a file"', rule="local-path-wrong-kind",
         names="the file requirements.txt", path="artifacts.default.path", file=ROOT_FILE,
         fix="name a directory, e.g. .,"),
    Case("artifact path outside the bundle", _artifact_path("../shared"),
         "translate_paths_artifacts.go:18 AllowPathOutsideSyncRoot", code=0),
    # dashboards: read from the sync root after translation
    Case("dashboard file missing", _resources(dashboards={"d": {"display_name": "d", "warehouse_id": "w",
                                                                "file_path": "../gone.lvdash.json"}}),
         "resourcemutator/configure_dashboards_serialized_dashboard.go:47 (reads the file)", names="gone.lvdash.json",
         path="resources.dashboards.d.file_path", fix="create gone.lvdash.json"),
    # outside the bundle root: refused, unless sync.paths widens the sync root or the path may lie anywhere
    Case("notebook outside the bundle root", _notebook("../../shared/helper.py"),
         'translate_paths.go:157 "path %s is not contained in sync root path"', rule="local-path-outside-sync-root",
         names="../shared/helper.py from the bundle root", fix="move it into the bundle's folder"),
    Case("notebook outside the bundle root, synced", _both(_sync_parent, _notebook("../../shared/helper.py")),
         "sync_infer_root.go:38 (sync.paths [.., .] makes the parent the sync root)", code=0),
    Case("notebook outside the bundle root, synced, missing", _both(_sync_parent, _notebook("../../shared/gone.py")),
         'sync_infer_root.go:38, translate_paths.go:205 "notebook %s not found"', names="../shared/gone.py",
         fix="create ../shared/gone.py"),
    Case("-r requirements outside the bundle root", _environment_dependency("-r ../../shared/requirements.txt"),
         "translate_paths.go:369 (library paths may lie outside the sync root)", code=0),
    # left alone
    Case("remote /Workspace notebook", _notebook("/Workspace/Shared/train"),
         "translate_paths.go:130 (absolute paths point into the workspace)", code=0),
    Case("URL of a python_file", _python_file("dbfs:/FileStore/gone.py"),
         "translate_paths.go:140 (a path with a scheme is not local)", code=0),
    Case("${workspace.file_path} notebook", _notebook("${workspace.file_path}/notebooks/gone"),
         "translate_paths.go:130 (resolves to an absolute workspace path)", code=0),
    Case("job with git_source", _resources(jobs={"paths": {
        "name": "paths", "git_source": {"git_url": "https://github.com/o/r", "git_provider": "gitHub",
                                        "git_branch": "main"},
        "tasks": [{"task_key": "t", "existing_cluster_id": "abc",
                   "notebook_task": {"notebook_path": "gone", "source": "GIT"}}]}}),
         "translate_paths_jobs.go:30 (no translation with git_source)", code=0),
    Case("local wheel a build creates", _task(spark_python_task={"python_file": "../src/job.py"},
                                              libraries=[{"whl": "../dist/gone-0.1-py3-none-any.whl"}]),
         "paths/job_libraries_paths_visitor.go:11, translate_paths.go:291 (unchecked; the build checks it: "
         "bundle/libraries/expand_glob_references.go:51)", code=0),
    Case("cluster init script", _task(spark_python_task={"python_file": "../src/job.py"}, existing_cluster_id=None,
                                      new_cluster={"spark_version": "17.3.x-scala2.13", "num_workers": 1,
                                                   "node_type_id": "Standard_D8ds_v5",
                                                   "init_scripts": [{"workspace": {"destination": "gone.sh"}}]}),
         "paths/visitor.go:11 (init scripts are not among the translated paths)", code=0),
    # references: resolved before the paths (resourcemutator/process_static_resources.go:46), relative to the file
    # that holds the reference (libs/dyn/dynvar/resolve.go:173)
    Case("${var.x} that names a missing notebook", _variable_notebook("../notebooks/gone.py"),
         "resourcemutator/process_static_resources.go:46, dynvar/resolve.go:173", names="notebooks/gone.py",
         fix="the CLI reads it from resources/, the folder of the file setting it"),
    Case("${var.x} that names a notebook", _variable_notebook("../notebooks/train.py"),
         "resourcemutator/process_static_resources.go:46", code=0),
    # targets: each target's merged tree
    Case("prod overrides the notebook with a missing one", _prod_notebook("notebooks/gone.py"),
         "translate_paths.go:205 on the prod target's tree", names="notebooks/gone.py", file=ROOT_FILE,
         target="prod", fix="the CLI reads it from the bundle root, the folder of the file setting it"),
    Case("prod overrides the notebook with one that exists", _prod_notebook("notebooks/train.py"),
         "translate_paths.go:197 on the prod target's tree", code=0),
]
MIN_CASES = 39


def test_the_matrix_keeps_its_cases():
    assert len(CASES) >= MIN_CASES
    assert len({case.name for case in CASES}) == len(CASES)
    assert all(".go" in case.source for case in CASES)
    assert {case.code for case in CASES} == {0, 1}
    assert {case.rule for case in CASES} == {"local-path-missing", "local-path-wrong-kind",
                                             "local-path-outside-sync-root"}


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_local_path(case, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    for name, text in PROJECT_FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    bundle = tmp_path / "bundle"
    shutil.copytree(GOOD, bundle, dirs_exist_ok=True)
    case.make(bundle)
    code = main(["validate", str(bundle)])
    lines = capsys.readouterr().out.splitlines()
    assert code == case.code, "\n".join(lines)
    errors = [index for index, line in enumerate(lines) if " error [" in line]
    if case.code == 0:
        assert errors == [], "\n".join(lines)
        return
    [index] = errors
    line, fix = lines[index], lines[index + 1]
    assert line.startswith(f"{case.file}:{case.path}: error [{case.rule}] "), line
    assert case.names in line, line
    assert fix.startswith("    fix: ") and case.fix in fix, fix
    header = next(line for line in reversed(lines[:index]) if line.startswith("== "))
    assert header == (f"== target {case.target} ==" if case.target else "== every target (dev, prod) =="), header
    assert lines[-1].startswith("1 error"), lines[-1]
