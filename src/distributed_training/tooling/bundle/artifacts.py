"""The `artifacts` block, as the Databricks CLI prepares it before a deploy (bundle/artifacts/prepare.go,
expand_globs.go); each finding here stops `databricks bundle validate` with an error.

- An artifact left empty (`my_wheel:` with nothing after it) is "not properly configured".
- An artifact needs a `build` command or `files` (a `whl` artifact without either builds with setup.py).
- An artifact with `files` and no `build` ships files that must be there now: each `files[].source` is a glob, read
  from the folder of the file that defines the artifact, that must match at least one file ("no matching files"), as
  Go's filepath.Glob reads it. With a `build`, the files appear only when it runs, and are not checked.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path as FilePath
from typing import Mapping

from ...findings import Finding
from .jobs_and_clusters import as_list, as_mapping
from .loader import bad_pattern, glob_like_go
from .paths import format_path
from .sourced_trees import file_at


def artifact_findings(tree: Mapping, sourced: Mapping, bundle_root: FilePath) -> list[Finding]:
    """The findings above for a target's tree (references resolved; `sourced`: the same tree before, which knows the
    file of each artifact)."""
    findings = []
    for name, artifact in as_mapping(tree.get("artifacts")).items():
        where = format_path(("artifacts", str(name)))
        if artifact is None:
            findings.append(Finding("artifact-incomplete", f"artifact {name!r} has no fields: the CLI stops "
                                    "(\"Artifact not properly configured\")", "give it a build command (e.g. build: "
                                    "uv build --wheel) or files, or remove it", path=where))
            continue
        artifact = as_mapping(artifact)
        files = as_list(artifact.get("files"))
        if not artifact.get("build") and not files and artifact.get("type") != "whl":
            findings.append(Finding("artifact-incomplete", f"artifact {name!r} has neither build nor files: the CLI "
                                    "stops (\"misconfigured artifact\")", "add build: <command that makes it> (e.g. "
                                    "uv build --wheel), or files: [{source: <path>}]", path=where))
        if files and not artifact.get("build"):
            folder = posixpath.dirname(file_at(sourced, ("artifacts", name)) or "")
            findings += [finding for index, file in enumerate(files)
                         for finding in _source(as_mapping(file).get("source"), folder, bundle_root,
                                                format_path(("artifacts", str(name), "files", index, "source")))]
    return findings


def _source(source: object, folder: str, bundle_root: FilePath, where: str) -> list[Finding]:
    if not isinstance(source, str) or not source or "${" in source:
        return []
    pattern = source if os.path.isabs(source) else posixpath.normpath(posixpath.join(folder, source))
    problem = bad_pattern(pattern)
    if problem is None and glob_like_go(bundle_root, pattern):
        return []
    why = f"is not a valid glob pattern ({problem})" if problem else "matches no file"
    return [Finding("artifact-file-missing", f"artifact file {source!r} {why}: the CLI stops (\"no matching "
                    f"files\"), as it ships the files as they are when no build makes them",
                    f"build the file first, or fix the path (read from {folder or 'the bundle root'}), or add a build "
                    "command that makes it", path=where)]
