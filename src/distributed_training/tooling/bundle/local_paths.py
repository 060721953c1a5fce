"""The project's files that the Databricks CLI's path translation resolves must be there, and be what it expects.

As the CLI reads them (v1.13.0, bundle/config/mutator/): a local path is relative to the folder of the YAML file
that sets it, after variables are resolved (normalize_paths.go:87), and must lie inside the sync root: the bundle
root, or the folder above it that `sync.paths` reaches (translate_paths.go:153, sync_infer_root.go:38). Libraries,
environment dependencies and artifacts may lie outside it. What each path must be:
- a notebook: a job task's `notebook_task.notebook_path`, a pipeline's `libraries[].notebook.path`
  (paths/job_paths_visitor.go:20, paths/pipeline_paths_visitor.go:28); a .py/.r/.scala/.sql file with the
  notebook header line, or an .ipynb (translate_paths.go:197, libs/notebook/detect.go:82);
- a file that is no notebook: `spark_python_task.python_file`, `sql_task.file.path`, `alert_task.workspace_path`,
  `libraries[].requirements`, `ai_runtime_task.deployments[].command_path`, a pipeline's `libraries[].file.path`
  (job_paths_visitor.go:25-53, pipeline_paths_visitor.go:33), and the path in a `-r`/`-e` environment dependency
  (job_libraries_paths_visitor.go:65, pipeline_paths_visitor.go:80, translate_paths.go:182);
- a directory: `dbt_task.project_directory`, a pipeline's `root_path`, an app's `source_code_path`, an artifact's
  `path` (job_paths_visitor.go:30, pipeline_paths_visitor.go:43, app_paths_visitor.go:16,
  artifact_paths_visitor.go:23);
- a file the CLI reads: a dashboard's, genie space's or alert's `file_path`
  (resourcemutator/configure_dashboards_serialized_dashboard.go:47, configure_genie_space_serialized_space.go:51,
  load_dbalert_files.go:102);
- only inside the sync root: a pipeline's `libraries[].glob.include` (translate_paths.go:269).
Every task counts, the one inside a `for_each_task` too (job_paths_visitor.go:71). A pipeline's `notebook.path` or
`file.path` that is a glob stands for the files it matches, each of which must be what the CLI expects; one that
matches nothing is kept as written, and so is missing (resourcemutator/expand_pipeline_glob_paths.go). A path set
inside a complex variable is read from the folder of the file that defines the variable
(translate_paths_test.go, TestTranslatePathWithComplexVariables).

Only regular files are opened (a FIFO would block the read forever), and an .ipynb only up to the size the workspace
imports (docs.databricks.com/aws/en/notebooks/notebook-limitations: IPYNB notebooks up to 100 MB).

Left alone, as the CLI leaves them: absolute paths (workspace, volume, DBFS) and URLs (translate_paths.go:130-142);
values holding a reference that resolves only at deploy; every path of a job with `git_source`
(translate_paths_jobs.go:30); `whl`/`jar` libraries and other environment dependencies, translated unchecked
(translate_paths.go:291) because a build may create them: the build phase checks them at deploy
(bundle/libraries/expand_glob_references.go:41); cluster init scripts, which it does not translate
(paths/visitor.go:11). A local `code_source_path` is checked from the bundle root by `serverless_tasks`.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import stat
from pathlib import Path as FilePath
from typing import Any, Iterator, Mapping

from ...findings import Finding
from .jobs_and_clusters import Jobs, as_list, as_mapping
from .loader import glob_like_go
from .paths import Path, format_path, get_at
from .references import references_in
from .sourced_trees import file_at
from .yaml_files import special_file_kind

NOTEBOOK, FILE, DIRECTORY, READ, GLOB = "notebook", "file", "directory", "read", "glob"  # what a path must be
NOTEBOOKS, FILES = "notebooks", "files"  # a pipeline's library path: each file a glob in it matches is one
MISSING, FOLDER, PLAIN, BAD_NOTEBOOK = "missing", "folder", "plain", "bad notebook"  # what is there (or NOTEBOOK),
SPECIAL, TOO_LARGE = "special", "too large"  # or neither a regular file nor a folder, or an .ipynb over the limit
MAX_NOTEBOOK_BYTES = 100 * 1000 * 1000
NOTEBOOK_EXTENSIONS = (".py", ".r", ".scala", ".sql", ".ipynb")  # libs/notebook/ext.go:52, in the CLI's order
HEADERS = {".py": "# Databricks notebook source", ".r": "# Databricks notebook source",
           ".scala": "// Databricks notebook source", ".sql": "-- Databricks notebook source"}  # detect.go:110
TASK_PATHS = {"notebook_task": (("notebook_path",), NOTEBOOK), "spark_python_task": (("python_file",), FILE),
              "dbt_task": (("project_directory",), DIRECTORY), "sql_task": (("file", "path"), FILE),
              "alert_task": (("workspace_path",), FILE)}
PIP_FLAGS = ("-r ", "-e ")  # bundle/libraries/local_path.go:81
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")  # a URL scheme as Go's net/url reads one
GLOB_CHARACTERS = re.compile(r"[*?\[]")  # what makes Go's filepath.Glob match more than the name itself




def local_path_findings(tree: Mapping, sourced: Mapping, bundle_root: FilePath, kinds: dict,
                        jobs: Jobs) -> list[Finding]:
    """A finding for every local path of a target's tree (its references resolved; `sourced`: the same tree before,
    which knows each value's file) that is missing, outside the sync root, or not what the CLI expects there.
    `kinds`: what is at each path from the bundle root, shared by every target so that no file is read twice."""
    levels_up = _sync_levels_up(tree, sourced)
    verdicts: dict[tuple, tuple[str, str, str] | None] = {}  # many values name the same path from the same folder
    findings = []
    for path, literal, expected, anywhere in _resolved_paths(tree, jobs):
        value = literal.split(" ", 1)[1].strip().strip("\"'") if expected == "pip" else literal
        if not value or "${" in value or value.startswith("/") or SCHEME.match(value):
            continue
        file = defining_file(sourced, path) or ""
        key = (posixpath.dirname(file), literal, expected, anywhere)
        if key not in verdicts:
            verdicts[key] = _verdict(key[0], literal, value, FILE if expected == "pip" else expected,
                                     None if anywhere else levels_up, bundle_root, kinds)
        if verdicts[key] is not None:
            rule, message, fix = verdicts[key]
            findings.append(Finding(rule, message, fix, file=file or None, path=format_path(path)))
    return findings


def _resolved_paths(tree: Mapping, jobs: Jobs) -> Iterator[tuple[Path, str, str, bool]]:
    """(path, value, what it must be, whether it may lie outside the sync root) for every string value the CLI's
    path translation resolves (see the module's docstring); `pip`: a dependency that may be `-r`/`-e` PATH."""
    for job_key, job, tasks in jobs:
        if "git_source" in job:
            continue
        job_path = ("resources", "jobs", job_key)
        for task_path, task in tasks:
            for name, (fields, expected) in TASK_PATHS.items():
                value = task.get(name)
                if value is not None and isinstance(value := get_at(value, fields), str):
                    yield (*task_path, name, *fields), value, expected, False
            for index, library in enumerate(as_list(task.get("libraries"))):
                if isinstance(as_mapping(library).get("requirements"), str):
                    yield (*task_path, "libraries", index, "requirements"), library["requirements"], FILE, False
            for index, deployment in enumerate(as_list(as_mapping(task.get("ai_runtime_task")).get("deployments"))):
                if isinstance(as_mapping(deployment).get("command_path"), str):
                    yield ((*task_path, "ai_runtime_task", "deployments", index, "command_path"),
                           deployment["command_path"], FILE, False)
        for index, environment in enumerate(as_list(job.get("environments"))):
            dependencies = (*job_path, "environments", index, "spec", "dependencies")
            yield from _pip_flags(as_mapping(as_mapping(environment).get("spec")).get("dependencies"), dependencies)
    resources = as_mapping(tree.get("resources"))
    for key, pipeline in as_mapping(resources.get("pipelines")).items():
        pipeline_path = ("resources", "pipelines", str(key))
        for index, library in enumerate(as_list(as_mapping(pipeline).get("libraries"))):
            for fields, expected in ((("notebook", "path"), NOTEBOOKS), (("file", "path"), FILES),
                                     (("glob", "include"), GLOB)):
                value = get_at(library, fields)
                if isinstance(value, str):
                    yield (*pipeline_path, "libraries", index, *fields), value, expected, False
        if isinstance(as_mapping(pipeline).get("root_path"), str):
            yield (*pipeline_path, "root_path"), pipeline["root_path"], DIRECTORY, False
        environment = as_mapping(as_mapping(pipeline).get("environment"))
        yield from _pip_flags(environment.get("dependencies"), (*pipeline_path, "environment", "dependencies"))
    for kind, field, expected, anywhere in (("apps", "source_code_path", DIRECTORY, False),
                                            ("dashboards", "file_path", READ, False),
                                            ("genie_spaces", "file_path", READ, False),
                                            ("alerts", "file_path", READ, True)):
        for key, resource in as_mapping(resources.get(kind)).items():
            if isinstance(as_mapping(resource).get(field), str):
                yield ("resources", kind, str(key), field), resource[field], expected, anywhere
    for key, artifact in as_mapping(tree.get("artifacts")).items():
        if isinstance(as_mapping(artifact).get("path"), str):
            yield ("artifacts", str(key), "path"), artifact["path"], DIRECTORY, True


def defining_file(sourced: Mapping, path: Path, hops: int = 10) -> str | None:
    """The file whose folder the CLI reads the local path at `path` from: the file that sets it, or for a path inside
    a complex variable's value (`libraries: ${var.libs}`), the file that defines the variable's value (followed
    through at most `hops` variables: a cycle is the resolver's finding)."""
    node: Any = sourced
    for index, part in enumerate(path):
        if isinstance(node, str):
            references = references_in(node)
            whole = len(references) == 1 and references[0].text == node and references[0].path is not None
            variable = _variable_value_path(sourced, references[0].path) if whole else None
            if variable is None or hops == 0:
                break
            return defining_file(sourced, (*variable, *path[index:]), hops - 1) or file_at(sourced, path)
        if isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int) \
                and 0 <= part < len(node):
            node = node[part]
        else:
            break
    return file_at(sourced, path)


def _variable_value_path(sourced: Mapping, reference: Path) -> Path | None:
    """Where a `${var.x...}` (or `${variables.x.value...}`) reference's value is written in a target tree: the
    declaration's `value`, else its `default` (a target's value lands there too, see `merging`)."""
    if reference[:1] == ("var",) and len(reference) > 1:
        name, rest = reference[1], reference[2:]
    elif reference[:1] == ("variables",) and reference[2:3] == ("value",):
        name, rest = reference[1], reference[3:]
    else:
        return None
    declared = as_mapping(as_mapping(sourced.get("variables")).get(name))
    return ("variables", name, "value" if declared.get("value") is not None else "default", *rest)


def _pip_flags(dependencies: Any, path: Path) -> Iterator[tuple[Path, str, str, bool]]:
    for index, dependency in enumerate(as_list(dependencies)):
        if isinstance(dependency, str) and dependency.startswith(PIP_FLAGS):
            yield (*path, index), dependency, "pip", True


def _levels_up(named: str) -> int:
    """How many folders above the bundle root a normalized path from it starts."""
    parts = named.split("/")
    return next((index for index, part in enumerate(parts) if part != ".."), len(parts))


def _sync_levels_up(tree: Mapping, sourced: Mapping) -> int:
    """How far above the bundle root the sync root lies: as far as the furthest `sync.paths` entry reaches."""
    levels = 0
    for index, value in enumerate(as_list(as_mapping(tree.get("sync")).get("paths"))):
        if isinstance(value, str) and "${" not in value and not value.startswith("/"):
            file = file_at(sourced, ("sync", "paths", index)) or ""
            levels = max(levels, _levels_up(posixpath.normpath(posixpath.join(posixpath.dirname(file), value))))
    return levels


def _kind(bundle_root: FilePath, named: str, kinds: dict) -> tuple[str, os.stat_result | None]:
    """What is at `named` (from the bundle root), as the CLI's notebook detection reads it (detect.go:82), and its
    stat (None when missing)."""
    if named not in kinds:
        kinds[named] = _read_kind(os.path.join(bundle_root, named))
    return kinds[named]


def _read_kind(full: str) -> tuple[str, os.stat_result | None]:
    try:
        info = os.stat(full)
    except (OSError, ValueError):
        return MISSING, None
    if stat.S_ISDIR(info.st_mode):
        return FOLDER, info
    if not stat.S_ISREG(info.st_mode):
        return SPECIAL, info
    extension = os.path.splitext(full)[1].lower()
    if extension == ".ipynb" and info.st_size > MAX_NOTEBOOK_BYTES:
        return TOO_LARGE, info
    return _read_regular_kind(full, extension), info


def _read_regular_kind(full: str, extension: str) -> str:
    try:
        if extension == ".ipynb":  # detect_jupyter.go:61: JSON with cells and metadata, else an error
            with open(full, "rb") as handle:  # bounded: the file may have grown since the stat
                notebook = json.loads(handle.read(MAX_NOTEBOOK_BYTES + 1).decode("utf-8"))
            valid = isinstance(notebook, dict) and notebook.get("cells") is not None \
                and notebook.get("metadata") is not None
            return NOTEBOOK if valid else BAD_NOTEBOOK
        if extension in HEADERS:
            with open(full, "rb") as handle:
                first_line = handle.read(32).split(b"\n", 1)[0].removesuffix(b"\r")
            return NOTEBOOK if first_line == HEADERS[extension].encode() else PLAIN
    except (OSError, ValueError, RecursionError):
        return BAD_NOTEBOOK if extension == ".ipynb" else PLAIN
    return PLAIN


def _verdict(folder: str, literal: str, value: str, expected: str, levels_up: int | None, bundle_root: FilePath,
             kinds: dict) -> tuple[str, str, str] | None:
    """(rule, message, fix) for `value` (as `literal` writes it) set in a file in `folder`, or None when the CLI takes
    it. `levels_up`: how far above the bundle root the path may lie (None: anywhere)."""
    named = posixpath.normpath(posixpath.join(folder, value))
    if expected in (NOTEBOOKS, FILES):
        expected = NOTEBOOK if expected == NOTEBOOKS else FILE
        matches = glob_like_go(bundle_root, named) if GLOB_CHARACTERS.search(named) else []
        if matches and (levels_up is None or _levels_up(named) <= levels_up):
            verdicts = (_verdict("", match, match, expected, levels_up, bundle_root, kinds) for match in matches)
            return next((verdict for verdict in verdicts if verdict is not None), None)
    what = "file" if expected == READ else expected
    if levels_up is not None and _levels_up(named) > levels_up:
        return ("local-path-outside-sync-root", f"{what} {literal!r} is {named} from the bundle root, outside the "
                "folders the CLI syncs (its sync root)", "move it into the bundle's folder, or widen the sync root "
                "with sync.paths (e.g. paths: [.., .] in databricks.yml)")
    if expected == GLOB:
        return None
    found, info = _kind(bundle_root, named, kinds)
    folder = f"{folder}/" if folder else "the bundle root"
    if found == SPECIAL:
        kind, noun = special_file_kind(info.st_mode)
        return _wrong_kind(literal, f"names {named}, {kind}, not a regular file or folder",
                           f"name a {what} there, or move the {noun} away")
    if found == TOO_LARGE:
        return ("local-path-too-large", f"{literal!r} names {named}, an .ipynb notebook of {info.st_size:,} bytes, "
                f"over the {MAX_NOTEBOOK_BYTES:,} bytes a workspace imports",
                "clear its outputs (Jupyter: Edit > Clear Outputs of All Cells) or split it into smaller notebooks")
    if found == MISSING:
        fix = f"create {named}, or correct the path: the CLI reads it from {folder}, the folder of the file setting it"
        if expected == NOTEBOOK and not posixpath.splitext(named)[1]:
            # translate_paths.go:210: the name without its extension, where a notebook with one exists
            for extension in NOTEBOOK_EXTENSIONS:
                if _kind(bundle_root, named + extension, kinds)[0] != MISSING:
                    fix = (f'did you mean "{literal}{extension}"? Local notebook references carry their extension '
                           f"({', '.join(NOTEBOOK_EXTENSIONS)})")
                    break
        return "local-path-missing", f"{what} {literal!r} not found: {named} is not in the project", fix
    if expected == DIRECTORY:
        if found == FOLDER:
            return None
        return _wrong_kind(literal, f"names the file {named}, and the CLI expects a directory there",
                           f"name a directory, e.g. {posixpath.dirname(literal) or '.'}, the one that holds it")
    if found == FOLDER:
        return _wrong_kind(literal, f"names the directory {named}, and the CLI expects a {what} there",
                           f"name a {what} inside it, relative to {folder}")
    if expected == NOTEBOOK and found != NOTEBOOK:
        return _wrong_kind(literal, f"names {named}, which is not a notebook", _notebook_fix(named, found))
    if expected == FILE and found == NOTEBOOK:
        return _wrong_kind(literal, f"names {named}, a notebook, and the CLI expects a plain file there",
                           "run it with a notebook_task, or drop its first line (the notebook header) to run it as "
                           "a file")
    if expected == FILE and found == BAD_NOTEBOOK:
        return _wrong_kind(literal, f"names {named}, an .ipynb file the CLI cannot read as a notebook",
                           "name the Python file itself, or fix the notebook's JSON")
    return None


def _notebook_fix(named: str, found: str) -> str:
    extension = posixpath.splitext(named)[1].lower()
    if found == BAD_NOTEBOOK:
        return "fix the notebook's JSON: it needs cells and metadata (save it again from Jupyter)"
    if extension in HEADERS:
        return (f'make it a notebook: its first line must be "{HEADERS[extension]}"; or run a Python file with a '
                "spark_python_task")
    return f"name a notebook: a file ending in one of {', '.join(NOTEBOOK_EXTENSIONS)}"


def _wrong_kind(literal: str, message: str, fix: str) -> tuple[str, str, str]:
    return "local-path-wrong-kind", f"{literal!r} {message}", fix
