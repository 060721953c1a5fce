"""Serverless GPU tasks (`ai_runtime_task`): the rules the CLI applies to their paths, and the platform's limits.

Paths, as the Databricks CLI reads them (v1.13.0):
- `code_source_path`, when local, is joined onto the bundle (sync) root, not the YAML file's folder, and must stay
  inside it; an existing directory is packaged into a tarball at deploy (v1.11.0+), which each node unpacks and names
  CODE_SOURCE_PATH. Any other local path is left to the artifact upload (a tarball an `artifacts` block builds, absent
  until the build; bundle/libraries/remote_path.go uploads it like a wheel): a path that is nothing, and that no
  artifact names, has nothing to upload. A local one is refused inside a for_each_task; a packaged directory is
  refused with git_source and with source-linked deployment, which uploads no files
  (bundle/config/mutator/aicode/validate.go). Source-linked deployment is on where
  `presets.source_linked_deployment: true`, and by default for a development target deployed from Databricks compute
  (a workspace Git folder, the web terminal), unless the preset is false
  (bundle/config/mutator/apply_source_linked_deployment_preset.go).
- `deployments[].command_path`, when local, is relative to the YAML file like a notebook path, and becomes
  ${workspace.file_path}/<path>: the file must exist inside the bundle (checked with every local path, see
  `local_paths`). Written as ${workspace.file_path}/<path>, it names the same synced file, which must exist too.
  (bundle/config/mutator/paths/job_paths_visitor.go)
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Any, Mapping

from ...findings import Finding
from ..serverless import check_accelerators, check_engine
from .jobs_and_clusters import Jobs, as_list, as_mapping, task_engine
from .paths import Path, format_path

CLASSIC_TASK_COMPUTE = ("job_cluster_key", "new_cluster", "existing_cluster_id", "libraries")
FILE_PATH_PREFIX = "${workspace.file_path}/"
NOT_WORKSPACE = ("/Volumes/", "/dbfs/", "dbfs:", "s3:", "abfss:", "gs:")



@dataclass(frozen=True)
class TargetDeploy:
    """What decides how the CLI deploys a local `code_source_path` in one target."""

    root: FilePath  # the bundle root
    target: str
    artifacts: tuple[tuple[str, ...], ...]  # per artifact: its build command and its files' sources
    source_linked: str | None  # SOURCE_LINKED_ON, SOURCE_LINKED_BY_DEFAULT, or None: files are uploaded

    @classmethod
    def of(cls, root: FilePath, target: str, tree: Mapping, mode: Any) -> TargetDeploy:
        preset = as_mapping(tree.get("presets")).get("source_linked_deployment")
        source_linked = (SOURCE_LINKED_ON if preset is True else
                         SOURCE_LINKED_BY_DEFAULT if preset is None and mode == "development" else None)
        artifacts = tuple((str(as_mapping(artifact).get("build") or ""), *(
            str(as_mapping(file).get("source")) for file in as_list(as_mapping(artifact).get("files"))))
            for artifact in as_mapping(tree.get("artifacts")).values())
        return cls(root, target, artifacts, source_linked)

    def builds(self, named: str) -> bool:
        """Whether an artifact names the file `named` (from the bundle root): its build command mentions the file's
        name, or one of its files' sources matches it."""
        name = posixpath.basename(named)
        return any(name in build or any(fnmatch.fnmatchcase(name, posixpath.basename(source)) for source in sources)
                   for build, *sources in self.artifacts)


SOURCE_LINKED_ON, SOURCE_LINKED_BY_DEFAULT = "on", "on from Databricks compute"


def serverless_gpu_findings(deploy: TargetDeploy, jobs: Jobs) -> list[Finding]:
    """Every `ai_runtime_task` of a target's tree (its references resolved): no classic compute beside it, one
    deployment (the preview's limit), accelerators the platform offers, paths as the CLI resolves them, and an engine
    whose loop runs under torchrun."""
    findings = []
    for job_key, job, tasks in jobs:
        gpu_tasks = [(path, task) for path, task in tasks if isinstance(task.get("ai_runtime_task"), dict)]
        for task_path, task in gpu_tasks:
            findings += _task_findings(task_path, task, deploy, "git_source" in job)
            findings += _torch_in_environment(job, job_key, task)
        if gpu_tasks:
            for task_path, task in tasks:
                engine = task_engine(task)
                if engine is not None:
                    findings += check_engine(engine, format_path((*task_path, "python_wheel_task", "parameters")))
    return findings


def _task_findings(task_path: Path, task: Mapping, deploy: TargetDeploy, git_source: bool) -> list[Finding]:
    findings = [Finding("mixed-compute", f"task {task.get('task_key')!r} runs on serverless GPU compute "
                        f"(ai_runtime_task) but also sets {name}, which belongs to classic clusters",
                        f"drop {name}: the task's size is its accelerator_type and accelerator_count, and its "
                        "packages are its environment's dependencies", path=format_path((*task_path, name)))
                for name in CLASSIC_TASK_COMPUTE if name in task]
    gpu_task = task["ai_runtime_task"]
    findings += _code_source(gpu_task.get("code_source_path"), (*task_path, "ai_runtime_task", "code_source_path"),
                             deploy, in_for_each="for_each_task" in task_path, git_source=git_source)
    deployments_path = (*task_path, "ai_runtime_task", "deployments")
    deployments = gpu_task.get("deployments")
    if isinstance(deployments, list) and len(deployments) != 1:
        findings.append(Finding("serverless-gpu-deployments",
                                f"ai_runtime_task has {len(deployments)} deployments; the preview runs exactly one",
                                "give one deployment: every node runs its command", path=format_path(deployments_path)))
    for index, entry in enumerate(deployments if isinstance(deployments, list) else []):
        findings += _command_path(as_mapping(entry).get("command_path"),
                                  (*deployments_path, index, "command_path"), deploy.root)
        compute = as_mapping(as_mapping(entry).get("compute"))
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


def _code_source(value: Any, path: Path, deploy: TargetDeploy, in_for_each: bool, git_source: bool
                 ) -> list[Finding]:
    if not _local(value):
        return []
    where = format_path(path)
    if in_for_each:
        return [Finding("code-source-in-for-each", "a local code_source_path is not supported inside a "
                        "for_each_task", "set code_source_path to a workspace or volume path", path=where)]
    named = posixpath.normpath(value)
    if named == ".." or named.startswith("../"):
        return [Finding("code-source-outside-bundle", f"code_source_path {value!r} is outside the bundle root: the "
                        "CLI reads it from the bundle root, not from the YAML file's folder",
                        "name a folder inside the bundle, relative to the folder of databricks.yml (e.g. src), or a "
                        "/Workspace or /Volumes path", path=where)]
    local = deploy.root / named
    if not local.is_dir():
        if local.exists() or deploy.builds(named):
            return []  # a file to upload as it is (a prebuilt tarball), or one an artifact builds
        return [Finding("code-source-missing", f"code_source_path {value!r} names nothing in the bundle ({named} "
                        "from the bundle root), and no artifact builds it: the CLI packages a folder and leaves any "
                        "other path to the artifact upload, which has nothing to upload", "name the project's source "
                        "folder from the bundle root (src), a tarball an artifacts entry builds, or a /Workspace or "
                        "/Volumes path that holds the code", path=where)]
    if git_source:
        return [Finding("code-source-with-git-source", "a local code_source_path cannot be combined with the "
                        "job's git_source", "remove git_source, or set code_source_path to a workspace or "
                        "volume path", path=where)]
    return _source_linked(value, where, deploy)


def _source_linked(value: str, where: str, deploy: TargetDeploy) -> list[Finding]:
    """Source-linked deployment uploads no files, so the packaged code would never reach the workspace: the CLI
    refuses a local code_source_path with it."""
    if deploy.source_linked is None:
        return []
    fix = (f"set presets: {{source_linked_deployment: false}} in target {deploy.target!r} (or set "
           "code_source_path to a workspace or volume path)")
    if deploy.source_linked == SOURCE_LINKED_ON:
        return [Finding("code-source-with-source-linked", f"code_source_path {value!r} is a local folder and target "
                        f"{deploy.target!r} has presets.source_linked_deployment: true: deployed from Databricks "
                        "compute, where the preset takes effect, the CLI refuses it (source-linked deployment runs "
                        "jobs on the source files in place and uploads none, so the packaged code would never reach "
                        "the workspace)", fix, path=where)]
    return [Finding("code-source-with-source-linked", f"code_source_path {value!r} is a local folder and target "
                    f"{deploy.target!r} is in development mode: a deploy from Databricks compute (a workspace Git "
                    "folder, the web terminal) turns on source-linked deployment, and the CLI then refuses it (the "
                    "packaged code would never be uploaded)", fix, path=where, severity="warning")]


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
