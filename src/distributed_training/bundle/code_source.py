"""A relative `code_source_path` of an `ai_runtime_task` is read, as the bundle CLI reads relative paths, from the
folder of the file that sets it. The folder or archive it names must be in the project, or no code reaches the nodes.
"""

from __future__ import annotations

import posixpath
from pathlib import Path as FilePath
from typing import Mapping

from ..findings import Finding
from .checks import jobs_of, tasks_of
from .paths import format_path
from .sourced import file_at


def code_source_findings(tree: Mapping, bundle_root: FilePath, root_file: str) -> list[Finding]:
    findings = []
    for job_key, job in jobs_of(tree):
        for task_path, task in tasks_of(job, ("resources", "jobs", job_key)):
            gpu_task = task.get("ai_runtime_task")
            value = gpu_task.get("code_source_path") if isinstance(gpu_task, dict) else None
            if not _local(value):
                continue
            path = (*task_path, "ai_runtime_task", "code_source_path")
            defined_in = file_at(tree, path) or root_file
            named = posixpath.normpath(posixpath.join(posixpath.dirname(defined_in), value))
            if not (bundle_root / named).exists():
                findings.append(Finding(
                    "code-source-missing",
                    f"code_source_path {value} names {named} in the project, and there is no such folder or file",
                    f"name the project's source folder relative to {defined_in} (../src from resources/), or a "
                    "/Workspace or /Volumes path that holds the code",
                    path=format_path(path), file=defined_in))
    return findings


def _local(value) -> bool:
    """A relative path inside the project (not a reference, an absolute workspace path or a URL)."""
    return isinstance(value, str) and bool(value) and "${" not in value and not value.startswith("/") \
        and ":" not in value
