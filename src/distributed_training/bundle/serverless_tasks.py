"""Serverless GPU tasks (`ai_runtime_task`): the rules the CLI applies to their paths, and the platform's limits.

Paths, as the Databricks CLI reads them (v1.13.0):
- `code_source_path`, when local, is joined onto the bundle (sync) root, not the YAML file's folder, and must stay
  inside it; an existing directory is packaged into a tarball at deploy (v1.11.0+), which each node unpacks and names
  CODE_SOURCE_PATH. A local one is refused inside a for_each_task and with git_source.
  (bundle/config/mutator/aicode/validate.go)
- `deployments[].command_path`, when local, is relative to the YAML file like a notebook path, and becomes
  ${workspace.file_path}/<path>: the file must exist inside the bundle (checked with every local path, see
  `local_paths`). Written as ${workspace.file_path}/<path>, it names the same synced file, which must exist too.
  (bundle/config/mutator/paths/job_paths_visitor.go)
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path as FilePath
from typing import Any, Mapping

from ..findings import Finding
from ..serverless import check_accelerators, check_engine
from .clusters import Jobs, as_mapping, task_engine
from .paths import Path, format_path

CLASSIC_TASK_COMPUTE = ("job_cluster_key", "new_cluster", "existing_cluster_id", "libraries")
FILE_PATH_PREFIX = "${workspace.file_path}/"
NOT_WORKSPACE = ("/Volumes/", "/dbfs/", "dbfs:", "s3:", "abfss:", "gs:")



def serverless_gpu_findings(bundle_root: FilePath, jobs: Jobs) -> list[Finding]:
    """Every `ai_runtime_task` of a target's tree (its references resolved): no classic compute beside it, one
    deployment (the preview's limit), accelerators the platform offers, paths as the CLI resolves them, and an engine
    whose loop runs under torchrun."""
    findings = []
    for job_key, job, tasks in jobs:
        gpu_tasks = [(path, task) for path, task in tasks if isinstance(task.get("ai_runtime_task"), dict)]
        for task_path, task in gpu_tasks:
            findings += _task_findings(task_path, task, bundle_root, "git_source" in job)
            findings += _torch_in_environment(job, job_key, task)
        if gpu_tasks:
            for task_path, task in tasks:
                engine = task_engine(task)
                if engine is not None:
                    findings += check_engine(engine, format_path((*task_path, "python_wheel_task", "parameters")))
    return findings


def _task_findings(task_path: Path, task: Mapping, root: FilePath, git_source: bool) -> list[Finding]:
    findings = [Finding("mixed-compute", f"task {task.get('task_key')!r} runs on serverless GPU compute "
                        f"(ai_runtime_task) but also sets {name}, which belongs to classic clusters",
                        f"drop {name}: the task's size is its accelerator_type and accelerator_count, and its "
                        "packages are its environment's dependencies", path=format_path((*task_path, name)))
                for name in CLASSIC_TASK_COMPUTE if name in task]
    gpu_task = task["ai_runtime_task"]
    findings += _code_source(gpu_task.get("code_source_path"), (*task_path, "ai_runtime_task", "code_source_path"),
                             root, in_for_each="for_each_task" in task_path, git_source=git_source)
    deployments_path = (*task_path, "ai_runtime_task", "deployments")
    deployments = gpu_task.get("deployments")
    if isinstance(deployments, list) and len(deployments) != 1:
        findings.append(Finding("serverless-gpu-deployments",
                                f"ai_runtime_task has {len(deployments)} deployments; the preview runs exactly one",
                                "give one deployment: every node runs its command", path=format_path(deployments_path)))
    for index, deployment in enumerate(deployments if isinstance(deployments, list) else []):
        findings += _command_path(as_mapping(deployment).get("command_path"),
                                  (*deployments_path, index, "command_path"), root)
        compute = as_mapping(as_mapping(deployment).get("compute"))
        if compute:
            prefix = format_path((*deployments_path, index, "compute")) + "."
            findings += check_accelerators(compute.get("accelerator_type"), compute.get("accelerator_count"), prefix)
    return findings


def _torch_in_environment(job: Mapping, job_key: str, task: Mapping) -> list[Finding]:
    """Serverless environment 5 and later have no torch in their base (Databricks' serverless environment versions):
    a GPU task that runs torch code on one must list torch among its environment's dependencies. Version 4 has it."""
    environments = job.get("environments") if isinstance(job.get("environments"), list) else []
    for index, environment in enumerate(environments):
        if not isinstance(environment, dict) or environment.get("environment_key") != task.get("environment_key"):
            continue
        spec = as_mapping(environment.get("spec"))
        version = str(spec.get("environment_version", ""))
        dependencies = spec.get("dependencies") if isinstance(spec.get("dependencies"), list) else []
        names = {re.split(r"[<>=!~\[ ;@]", str(item).strip(), maxsplit=1)[0].lower() for item in dependencies}
        if version.isdigit() and int(version) >= 5 and "torch" not in names:
            return [Finding("serverless-environment-without-torch",
                            f"task {task.get('task_key')!r} trains with torch on environment version {version}, "
                            "whose base has no torch (versions 5 and later dropped it), and its dependencies do not "
                            "add it", f"add torch to the dependencies of environment {task.get('environment_key')!r} "
                            "(e.g. torch==2.13.0), or use environment_version \"4\"",
                            path=format_path(("resources", "jobs", job_key, "environments", index, "spec",
                                              "dependencies")))]
    return []


def _local(value: Any) -> bool:
    """A path inside the project: not a reference, an absolute workspace or volume path, or a URL."""
    return isinstance(value, str) and bool(value) and "${" not in value and not value.startswith("/") \
        and ":" not in value


def _code_source(value: Any, path: Path, root: FilePath, in_for_each: bool, git_source: bool) -> list[Finding]:
    if not _local(value):
        return []
    where = format_path(path)
    named = posixpath.normpath(value)
    if named == ".." or named.startswith("../"):
        return [Finding("code-source-outside-bundle", f"code_source_path {value!r} is outside the bundle root: the "
                        "CLI reads it from the bundle root, not from the YAML file's folder",
                        "name a folder inside the bundle, relative to the folder of databricks.yml (e.g. src), or a "
                        "/Workspace or /Volumes path", path=where)]
    findings = []
    if not (root / named).is_dir():
        what = "a file" if (root / named).exists() else "nothing"
        findings.append(Finding("code-source-missing", f"code_source_path {value!r} names {what} in the bundle "
                                f"({named} from the bundle root): the CLI packages a folder",
                                "name the project's source folder from the bundle root (src), or a /Workspace or "
                                "/Volumes path that holds the code", path=where))
    if in_for_each:
        findings.append(Finding("code-source-in-for-each", "a local code_source_path is not supported inside a "
                                "for_each_task", "set code_source_path to a workspace or volume path", path=where))
    if git_source:
        findings.append(Finding("code-source-with-git-source", "a local code_source_path cannot be combined with the "
                                "job's git_source", "remove git_source, or set code_source_path to a workspace or "
                                "volume path", path=where))
    return findings


def _command_path(value: Any, path: Path, root: FilePath) -> list[Finding]:
    where = format_path(path)
    if isinstance(value, str) and value.startswith(NOT_WORKSPACE):
        return [Finding("serverless-gpu-command-path", f"command_path {value} is not a workspace path, and the "
                        "platform runs the script at a workspace path on each node",
                        "name a script of the project, e.g. ../src/command.sh from resources/ (the CLI syncs it to "
                        "${workspace.file_path}/src/command.sh)", path=where, severity="warning")]
    if isinstance(value, str) and value.startswith(FILE_PATH_PREFIX):
        named = posixpath.normpath(value[len(FILE_PATH_PREFIX):])
        if not named.startswith("../") and (root / named).is_file():
            return []
        return [Finding("command-file-missing", f"command_path {value} names {named} among the synced files, and the "
                        "project has no such file", "name a script of the project as ${workspace.file_path}/<path "
                        "from the bundle root>", path=where)]
    return []
