"""Python wheel tasks against the bundle's own Python project (pyproject.toml next to databricks.yml).

A `python_wheel_task` names a package and an entry point; on the cluster the task looks the entry point up in
the installed wheel's metadata. A typo in either only shows when the job runs, after deploy and cluster start.
Bundles without a pyproject.toml (the wheel is built elsewhere) are not checked against it.

Whatever builds it, the wheel must reach the task: a `python_wheel_task` with no library at all (no `libraries` on
the task; on serverless, no `dependencies` in the spec of its environment) fails at run time, the package not
found. The CLI does not check this (bundle/config/validate/job_task_cluster_spec.go only checks that the task has
compute; bundle/libraries only uploads the libraries that are there), so `wheel_library_findings` does. A task on an
existing cluster is spared: that cluster may have the package installed.
"""

from __future__ import annotations

import re
from pathlib import Path as FilePath
from typing import Any, Mapping

from ...findings import Finding
from .jobs_and_clusters import Jobs
from .paths import format_path


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def read_pyproject(path: FilePath) -> dict | str:
    """The parsed file, or why it could not be read."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return "reading pyproject.toml on Python 3.10 needs the tomli package (pip install tomli)"
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        return f"cannot read pyproject.toml: {error}"


def _packages(bundle_root: FilePath, pyproject: Mapping) -> set[str]:
    """Normalized names a wheel built from this project answers to: the project name and its top-level packages."""
    names = {_normalized(str(pyproject.get("project", {}).get("name", "")))} - {""}
    for folder in (bundle_root / "src", bundle_root):
        if folder.is_dir():
            names |= {_normalized(child.name) for child in folder.iterdir() if (child / "__init__.py").is_file()}
    return names


def _entry_points(pyproject: Mapping) -> set[str]:
    project = pyproject.get("project", {})
    declared = set(project.get("scripts", {}))
    for group in project.get("entry-points", {}).values():
        declared |= set(group)
    declared |= set(pyproject.get("tool", {}).get("poetry", {}).get("scripts", {}))
    return declared


def wheel_library_findings(jobs: Jobs) -> list[Finding]:
    findings = []
    for _, job, tasks in jobs:
        environments = {environment.get("environment_key"): environment for environment in
                        (job.get("environments") if isinstance(job.get("environments"), list) else [])
                        if isinstance(environment, dict) and isinstance(environment.get("environment_key"), str)}
        for path, task in tasks:
            wheel_task = task.get("python_wheel_task")
            if not isinstance(wheel_task, dict) or _present(task.get("libraries")) or "existing_cluster_id" in task:
                continue
            environment_key = task.get("environment_key")
            if isinstance(environment_key, str):
                spec = environments.get(environment_key, {}).get("spec")
                if _present(spec.get("dependencies") if isinstance(spec, dict) else spec):
                    continue
                fix = (f"add the wheel to the job's environment {environment_key!r}: spec: {{dependencies: "
                       "[../dist/*.whl]}, built by an artifacts entry (e.g. build: uv build --wheel)")
            else:
                fix = ("add libraries: [{whl: ../dist/*.whl}] to the task, built by an artifacts entry "
                       "(e.g. build: uv build --wheel)")
            package = wheel_task.get("package_name")
            findings.append(Finding(
                "wheel-task-without-library",
                f"task {task.get('task_key')!r} runs python_wheel_task {package!r} but installs no library: the run "
                "fails, the package not found on the compute", fix, path=format_path((*path, "python_wheel_task"))))
    return findings


def _present(value: Any) -> bool:
    """A non-empty list, or a `${...}` reference that may fill one."""
    return (isinstance(value, list) and len(value) > 0) or (isinstance(value, str) and "${" in value)


def wheel_task_findings(bundle_root: FilePath, jobs: Jobs) -> list[Finding]:
    pyproject_path = bundle_root / "pyproject.toml"
    if not pyproject_path.is_file():
        return []
    wheel_tasks = [(path, task["python_wheel_task"]) for _, _, tasks in jobs
                   for path, task in tasks if isinstance(task.get("python_wheel_task"), dict)]
    if not wheel_tasks:
        return []
    pyproject = read_pyproject(pyproject_path)
    if isinstance(pyproject, str):
        return [Finding("pyproject-unreadable", pyproject + "; wheel tasks were not checked against it",
                        "fix pyproject.toml", file="pyproject.toml", severity="warning")]
    packages, entry_points = _packages(bundle_root, pyproject), _entry_points(pyproject)
    findings = []
    for path, wheel_task in wheel_tasks:
        findings += _check_wheel_task(wheel_task, format_path((*path, "python_wheel_task")), packages, entry_points)
    return findings


def _check_wheel_task(wheel_task: Mapping, where: str, packages: set[str], entry_points: set[str]) -> list[Finding]:
    findings = []
    package, entry_point = wheel_task.get("package_name"), wheel_task.get("entry_point")
    if _plain(package) and _normalized(package) not in packages:
        findings.append(Finding(
            "wheel-package-unknown",
            f"package_name {package!r} is neither the project in pyproject.toml nor a package under src/ "
            f"(found: {', '.join(sorted(packages)) or 'none'})",
            "use the project's name from pyproject.toml [project] name", path=f"{where}.package_name"))
    if _plain(entry_point) and entry_point not in entry_points:
        declared = ", ".join(sorted(entry_points)) or "none"
        findings.append(Finding(
            "wheel-entry-point-missing",
            f"entry_point {entry_point!r} is not declared in pyproject.toml [project.scripts] (declared: {declared})",
            f'declare it: [project.scripts] {entry_point} = "<package>.<module>:<function>", or use one of: {declared}',
            path=f"{where}.entry_point"))
    return findings


def _plain(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and "${" not in value
