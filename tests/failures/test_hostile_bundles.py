"""The failure matrix of `validate` on hostile and careless bundles (issue 15): YAML that expands or nests without
bound, bundles the Databricks CLI refuses, and `--schema` files that are not the bundle schema.

Each case runs the command line (`validate BUNDLE [--schema FILE]`) and asserts the exit code, the rule and words of
its fix, the file it names, that no traceback was printed, and a time bound. Cases that could hang (a FIFO) or blow
up (alias bombs) run the real command in a child process under a timeout, so a hang fails the case instead of the
suite; the others run in process (a traceback there raises and fails the case). Where a rule follows the CLI, the
case names the CLI source it follows (github.com/databricks/cli).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

import distributed_training
from distributed_training.tooling.bundle import local_paths, yaml_files
from distributed_training.tooling.bundle.validate import validate_bundle
from distributed_training.tooling.cli import main

GOOD = Path(__file__).resolve().parents[1] / "fixtures" / "bundles" / "good"
ROOT_FILE, JOB_FILE = "databricks.yml", "resources/train.job.yml"
OVERRIDES = ".databricks/bundle/dev/variable-overrides.json"  # the dev target's variable values, read by the CLI
SOURCE_ROOT = Path(distributed_training.__file__).resolve().parents[1]
TIME_BOUND_S = 30  # each case takes well under a second; only a hang comes near this
SCHEMA_ENV = "DATABRICKS_BUNDLE_SCHEMA"


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Path], list[str]]  # edits a copy of the good bundle; returns extra command-line options
    code: int  # 0 clean (warnings allowed), 1 errors, 2 usage error
    rule: str  # as printed: "[rule]"; for exit 2, words of the one-line message
    fix: str  # words of the fix (for exit 2: of the message)
    file: str | None = None  # the file the finding names
    source: str = ""  # the CLI source file the rule follows, where it follows the CLI
    child: bool = False  # run in a child process: the case could hang or exhaust memory if the rule failed
    folder: str = "bundle"  # the name of the bundle's folder


def _write(bundle: Path, name: str, text: str) -> None:
    (bundle / name).parent.mkdir(parents=True, exist_ok=True)
    (bundle / name).write_text(text)


def _edit_yaml(bundle: Path, name: str, edit: Callable[[dict], None]) -> None:
    document = yaml.safe_load((bundle / name).read_text())
    edit(document)
    (bundle / name).write_text(yaml.safe_dump(document, sort_keys=False))


def _job(document: dict) -> dict:
    return document["resources"]["jobs"]["train"]


# ---------------------------------------------------------------- YAML that expands or nests without bound

def billion_laughs(levels: int = 9) -> str:
    text = 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for level in range(1, levels + 1):
        text += f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]\n"
    return text


def _bomb_in_include(bundle: Path) -> list[str]:
    _write(bundle, "resources/bomb.yml", billion_laughs())
    return []


def _bomb_in_root(bundle: Path) -> list[str]:
    (bundle / ROOT_FILE).write_text((bundle / ROOT_FILE).read_text() + billion_laughs())
    return []


def _bomb_as_merge_keys(bundle: Path) -> list[str]:
    """The same growth through `<<:` merge keys, each mapping merging the one before nine times over."""
    text = "m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8, i: 9}\n"
    for level in range(1, 10):
        text += f"m{level}: &m{level} {{" + ", ".join(f"k{n}: *m{level - 1}" for n in range(9)) + "}\n"
    _write(bundle, "resources/merge_bomb.yml", text)
    return []


def _deep_block(bundle: Path) -> list[str]:
    text = "".join(" " * depth + f"k{depth}:\n" for depth in range(400)) + " " * 400 + "x: 1\n"
    _write(bundle, "resources/deep.yml", text)
    return []


def _deep_flow(bundle: Path) -> list[str]:
    _write(bundle, "resources/deep.yml", "resources: " + "[" * 100_000 + "]" * 100_000 + "\n")
    return []


def _deep_flow_unclosed(bundle: Path) -> list[str]:
    _write(bundle, "resources/deep.yml", "resources: " + "{a: " * 50_000 + "\n")
    return []


def _recursive_alias(bundle: Path) -> list[str]:
    _write(bundle, "resources/loop.yml", "resources:\n  jobs: &jobs\n    again: *jobs\n")
    return []


def _huge_file(bundle: Path) -> list[str]:
    """A sparse file just over the limit: refused by its size, before a byte is read."""
    with open(bundle / "resources" / "huge.yml", "wb") as file:
        file.truncate(yaml_files.MAX_FILE_BYTES + 1)
    return []


# ---------------------------------------------------------------- includes (process_root_includes.go)

INCLUDES = "bundle/config/loader/process_root_includes.go"


def _include(pattern: str) -> Callable[[Path], list[str]]:
    def make(bundle: Path) -> list[str]:
        _edit_yaml(bundle, ROOT_FILE, lambda document: document["include"].append(pattern))
        return []
    return make


def _include_absolute(bundle: Path) -> list[str]:
    return _include(str(bundle / "resources" / "*.yml"))(bundle)


def _text_file_among_matches(bundle: Path) -> list[str]:
    _write(bundle, "resources/README.txt", "notes\n")
    return _include("resources/*")(bundle)


def _folder_among_matches(bundle: Path) -> list[str]:
    (bundle / "resources" / "more.yml").mkdir()
    return []


def _fifo_among_matches(bundle: Path) -> list[str]:
    os.mkfifo(bundle / "resources" / "pipe.yml")
    return []


def _broken_link_among_matches(bundle: Path) -> list[str]:
    (bundle / "resources" / "gone.yml").symlink_to(bundle / "resources" / "deleted.yml")
    return []


# ---------------------------------------------------------------- local paths that are no regular file, or too large

def _task_on(field: str, path: str, make_file: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """A task of the train job whose `field` (notebook_task.notebook_path, ...) names `path` (from resources/), made
    by `make_file` from the bundle root."""
    def make(bundle: Path) -> list[str]:
        task_type, name = field.split(".")
        task = {"task_key": "extra", "job_cluster_key": "gpu", task_type: {name: path}}
        _edit_yaml(bundle, JOB_FILE, lambda document: _job(document)["tasks"].append(task))
        (bundle / "notebooks").mkdir()
        make_file(bundle / "notebooks" / path.rsplit("/", 1)[1])
        return []
    return make


def _sparse(size: int) -> Callable[[Path], None]:
    """A file of `size` bytes that uses no disk."""
    def make(file: Path) -> None:
        with open(file, "wb") as handle:
            handle.truncate(size)
    return make


def _overrides_fifo(bundle: Path) -> list[str]:
    (bundle / OVERRIDES).parent.mkdir(parents=True)
    os.mkfifo(bundle / OVERRIDES)
    return []


# ---------------------------------------------------------------- what else the CLI refuses

def _no_bundle_section(bundle: Path) -> list[str]:
    _edit_yaml(bundle, ROOT_FILE, lambda document: document.pop("bundle"))
    return []


def _empty_bundle_name(bundle: Path) -> list[str]:
    _edit_yaml(bundle, ROOT_FILE, lambda document: document["bundle"].update(name=""))
    return []


def _reference(text: str) -> Callable[[Path], list[str]]:
    def make(bundle: Path) -> list[str]:
        _edit_yaml(bundle, JOB_FILE, lambda document: _job(document).update(description=text))
        return []
    return make


def _wheel_without_library(bundle: Path) -> list[str]:
    _edit_yaml(bundle, JOB_FILE, lambda document: [task.pop("libraries") for task in _job(document)["tasks"]])
    return []


def _serverless_wheel_without_dependency(bundle: Path) -> list[str]:
    def edit(document: dict) -> None:
        job = _job(document)
        job.pop("job_clusters")
        job["environments"] = [{"environment_key": "default", "spec": {"environment_version": "4"}}]
        for task in job["tasks"]:
            task.pop("job_cluster_key")
            task.pop("libraries")
            task["environment_key"] = "default"
    _edit_yaml(bundle, JOB_FILE, edit)
    return []


def _unknown_top_level_key(bundle: Path) -> list[str]:
    _edit_yaml(bundle, ROOT_FILE, lambda document: document.update(resource={"jobs": {}}))
    return []


def _unknown_target_key(bundle: Path) -> list[str]:
    _edit_yaml(bundle, ROOT_FILE, lambda document: document["targets"]["prod"].update(run_ass={"user_name": "x"}))
    return []


def _num_nodes(value: str) -> Callable[[dict], None]:
    def edit(document: dict) -> None:
        _job(document)["tasks"][0]["python_wheel_task"]["parameters"] += ["--num-nodes", value]
    return edit


def _target_makes_single_node_multi_node(bundle: Path) -> list[str]:
    """The generated single-node cluster (profile, master, tag) and `--num-nodes 1`; prod asks for 3 workers."""
    _edit_yaml(bundle, JOB_FILE, _num_nodes("1"))
    _edit_yaml(bundle, ROOT_FILE, lambda document: document["targets"]["prod"].update(resources={"jobs": {"train": {
        "job_clusters": [{"job_cluster_key": "gpu", "new_cluster": {"num_workers": 3}}]}}}))
    return []


def _target_makes_new_form_multi_node(bundle: Path) -> list[str]:
    def edit(document: dict) -> None:
        cluster = _job(document)["job_clusters"][0]["new_cluster"]
        for key in ("num_workers", "spark_conf", "custom_tags"):
            cluster.pop(key)
        cluster.update(kind="CLASSIC_PREVIEW", is_single_node=True, use_ml_runtime=True,
                       spark_version="17.3.x-scala2.13")
        _num_nodes("1")(document)
    _edit_yaml(bundle, JOB_FILE, edit)
    _edit_yaml(bundle, ROOT_FILE, lambda document: document["targets"]["prod"].update(resources={"jobs": {"train": {
        "job_clusters": [{"job_cluster_key": "gpu", "new_cluster": {"autoscale": {"min_workers": 1,
                                                                                  "max_workers": 4}}}]}}}))
    return []


def _more_nodes_than_the_cluster(bundle: Path) -> list[str]:
    _edit_yaml(bundle, JOB_FILE, _num_nodes("2"))
    return []


# ---------------------------------------------------------------- --schema that is not the bundle schema

def _schema(content: str | None, kind: str = "file") -> Callable[[Path], list[str]]:
    def make(bundle: Path) -> list[str]:
        path = bundle.parent / "schema.json"
        if kind == "folder":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path.write_text(content)
        return ["--schema", str(path)]
    return make


CASES = [
    # YAML that expands or nests without bound: limits the CLI's loader lacks (libs/dyn/yamlloader/loader.go
    # expands every alias), so no CLI source; each is refused before a node is built.
    Case("alias bomb in an included file", _bomb_in_include, 1, "[yaml-too-many-values]",
         "use aliases for small shared parts only", "resources/bomb.yml", child=True),
    Case("alias bomb in the root file", _bomb_in_root, 1, "[yaml-too-many-values]",
         "use aliases for small shared parts only", ROOT_FILE, child=True),
    Case("alias bomb through merge keys", _bomb_as_merge_keys, 1, "[yaml-too-many-values]",
         "an alias of an alias multiplies", "resources/merge_bomb.yml", child=True),
    Case("deep block nesting", _deep_block, 1, "[yaml-too-deep]", "flatten the structure", "resources/deep.yml",
         child=True),
    Case("deep flow nesting", _deep_flow, 1, "[yaml-too-deep]", "flatten the structure", "resources/deep.yml",
         child=True),
    Case("deep unclosed flow nesting", _deep_flow_unclosed, 1, "[yaml-too-deep]", "flatten the structure",
         "resources/deep.yml"),
    Case("alias inside its own anchor", _recursive_alias, 1, "[yaml-recursive-alias]", "move *jobs out of the value",
         "resources/loop.yml", "libs/dyn/yamlloader/loader.go"),
    Case("file over the size limit", _huge_file, 1, "[yaml-too-large]", "split it into several files",
         "resources/huge.yml"),
    # includes
    Case("absolute include", _include_absolute, 1, "[include-absolute]", "relative to the folder of databricks.yml",
         ROOT_FILE, INCLUDES),
    Case("a text file among the matches", _text_file_among_matches, 1, "[include-not-yaml]", "sync.include",
         ROOT_FILE, INCLUDES),
    Case("include of a missing file", _include("resources/gone.yml"), 1, "[include-file-missing]",
         "create the file, fix the path", ROOT_FILE, INCLUDES),
    Case("a folder among the matches", _folder_among_matches, 1, "[unreadable-file]", "move the folder away",
         "resources/more.yml", INCLUDES),
    Case("a FIFO among the matches", _fifo_among_matches, 1, "[unreadable-file]", "move the pipe away",
         "resources/pipe.yml", INCLUDES, child=True),
    Case("a broken link among the matches", _broken_link_among_matches, 1, "[unreadable-file]",
         "point the link at a YAML file", "resources/gone.yml", INCLUDES),
    Case("a glob that matches nothing", _include("jobs/*.yml"), 0, "[include-matches-nothing]", "fix the glob",
         ROOT_FILE, INCLUDES),
    Case("a malformed glob", _include("resources/[.yml"), 1, "[include-bad-pattern]", "close the [ ] class",
         ROOT_FILE, INCLUDES),
    Case("glob characters in the bundle's folder", lambda bundle: [], 1, "[bundle-root-has-glob-characters]",
         "rename or move the folder", ROOT_FILE, INCLUDES, folder="bundle[1]"),
    # local paths: a FIFO would block the read that tells a notebook from a file; an .ipynb is parsed only up to the
    # size a workspace imports (docs.databricks.com/aws/en/notebooks/notebook-limitations)
    Case("a notebook path that is a FIFO", _task_on("notebook_task.notebook_path", "../notebooks/pipe.py", os.mkfifo),
         1, "[local-path-wrong-kind]", "move the pipe away", JOB_FILE, child=True),
    Case("an .ipynb notebook path that is a FIFO",
         _task_on("notebook_task.notebook_path", "../notebooks/pipe.ipynb", os.mkfifo), 1, "[local-path-wrong-kind]",
         "move the pipe away", JOB_FILE, child=True),
    Case("a python_file that is a FIFO", _task_on("spark_python_task.python_file", "../notebooks/pipe.py", os.mkfifo),
         1, "[local-path-wrong-kind]", "name a file there, or move the pipe away", JOB_FILE, child=True),
    Case("a multi-GB .ipynb notebook", _task_on("notebook_task.notebook_path", "../notebooks/huge.ipynb",
                                                 _sparse(3 * 1024 ** 3)),
         1, "[local-path-too-large]", "clear its outputs", JOB_FILE, child=True),
    Case(".ipynb a byte over the import limit", _task_on("notebook_task.notebook_path", "../notebooks/big.ipynb",
                                                          _sparse(local_paths.MAX_NOTEBOOK_BYTES + 1)),
         1, "[local-path-too-large]", "split it into smaller notebooks", JOB_FILE, child=True),
    Case("variable-overrides.json that is a FIFO", _overrides_fifo, 1, "[variable-overrides-unreadable]",
         "or delete it", OVERRIDES, "bundle/config/mutator/set_variables.go", child=True),
    # bundle.name
    Case("no bundle section", _no_bundle_section, 1, "[bundle-name-missing]", "set bundle: {name:", ROOT_FILE,
         "bundle/config/mutator/default_workspace_root.go"),
    Case("an empty bundle name", _empty_bundle_name, 1, "[bundle-name-missing]", "set bundle: {name:", ROOT_FILE,
         "bundle/config/mutator/default_workspace_root.go"),
    # references to fields the CLI's structs lack
    Case("${bundle.<typo>}", _reference("${bundle.nmae}"), 1, "[reference-does-not-exist]",
         "did you mean ${bundle.name}?", JOB_FILE, "bundle/config/bundle.go"),
    Case("${workspace.<typo>}", _reference("${workspace.rootpath}"), 1, "[reference-does-not-exist]",
         "did you mean ${workspace.root_path}?", JOB_FILE, "bundle/config/workspace.go"),
    Case("${workspace.current_user.<unknown>}", _reference("${workspace.current_user.email}"), 1,
         "[reference-does-not-exist]", "short_name, userName", JOB_FILE, "bundle/config/workspace.go"),
    Case("${bundle.git.<unknown>}", _reference("${bundle.git.sha}"), 1, "[reference-does-not-exist]",
         "origin_url", JOB_FILE, "bundle/config/git.go"),
    # a wheel task with nothing to install its wheel from (the Jobs API fails the run; the CLI does not check it:
    # bundle/config/validate/job_task_cluster_spec.go checks compute only)
    Case("wheel task without libraries", _wheel_without_library, 1, "[wheel-task-without-library]",
         "add libraries: [{whl: ../dist/*.whl}]", JOB_FILE),
    Case("serverless wheel task without dependencies", _serverless_wheel_without_dependency, 1,
         "[wheel-task-without-library]", "spec: {dependencies: [../dist/*.whl]}", JOB_FILE),
    # unknown keys: the CLI's warning "unknown field" (libs/dyn/convert/normalize.go over bundle/config/root.go)
    Case("unknown top-level key", _unknown_top_level_key, 0, "[unknown-key]", "did you mean 'resources'?", ROOT_FILE,
         "bundle/config/root.go"),
    Case("unknown target key", _unknown_target_key, 0, "[unknown-key]", "did you mean 'run_as'?", ROOT_FILE,
         "bundle/config/target.go"),
    # a target that makes a single-node cluster several nodes
    Case("target gives workers to the classic single-node form", _target_makes_single_node_multi_node, 1,
         "[single-node-settings-on-multi-node]", "remove spark_conf.spark.databricks.cluster.profile: singleNode",
         ROOT_FILE, "bundle/config/validate/single_node_cluster.go"),
    Case("target autoscales the new single-node form", _target_makes_new_form_multi_node, 1,
         "[single-node-settings-on-multi-node]", "remove is_single_node: true and pass --num-nodes 4", ROOT_FILE),
    Case("--num-nodes beyond a single-node cluster", _more_nodes_than_the_cluster, 1, "[num-nodes-mismatch]",
         "pass --num-nodes 1", JOB_FILE),
    # --schema that is not the bundle schema: a usage error (exit 2), one line
    Case("--schema names a folder", _schema(None, "folder"), 2, "not a regular file", "databricks bundle schema"),
    Case("--schema names a FIFO", _schema(None, "fifo"), 2, "not a regular file", "databricks bundle schema",
         child=True),
    Case("--schema is JSON but no schema", _schema('{"a": 1}'), 2, "is not the bundle's JSON schema",
         "databricks bundle schema"),
    Case("--schema is an invalid schema", _schema('{"type": 5, "properties": {"bundle": {}, "resources": {}}}'), 2,
         "is not a valid JSON schema", "databricks bundle schema"),
    Case("--schema is not JSON", _schema("bundle: {name: x}\n"), 2, "cannot read the bundle schema",
         "databricks bundle schema"),
    Case("--schema nests without bound", _schema("[" * 200_000 + "]" * 200_000), 2, "nested too deeply",
         "databricks bundle schema", child=True),
]
MIN_CASES = 42

# Every line `validate` prints: the schema line, a target header, a finding (one line: file:path, severity, rule,
# message), its fix (one line), the summary.
REPORT_LINE = re.compile(r"^(schema: .*|== .* ==|\S*:? ?(error|warning) \[[a-z0-9-]+\] .*|    fix: .*|"
                         r"\d+ errors?, \d+ warnings? \(.*\))$")


def test_the_matrix_does_not_shrink():
    assert len(CASES) >= MIN_CASES
    assert len({case.name for case in CASES}) == len(CASES)
    assert {case.code for case in CASES} == {0, 1, 2}
    assert sum(case.child for case in CASES) >= 5  # the hang- and memory-prone ones run the real command


def run_in_child(bundle: Path, *options: str) -> tuple[int, str, str, float]:
    environment = {key: value for key, value in os.environ.items() if key != SCHEMA_ENV}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_ROOT), environment.get("PYTHONPATH")]))
    started = time.monotonic()
    try:
        result = subprocess.run([sys.executable, "-m", "distributed_training", "validate", str(bundle), *options],
                                capture_output=True, text=True, env=environment, timeout=TIME_BOUND_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"validate ran past {TIME_BOUND_S} s (a hang): {expired.stdout!r} {expired.stderr!r}")
    return result.returncode, result.stdout, result.stderr, time.monotonic() - started


def run_in_process(bundle: Path, capsys, *options: str) -> tuple[int, str, str, float]:
    started = time.monotonic()
    code = main(["validate", str(bundle), *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err, time.monotonic() - started


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_bundle(case, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    bundle = tmp_path / case.folder
    shutil.copytree(GOOD, bundle)
    options = case.make(bundle)
    code, out, err, seconds = (run_in_child(bundle, *options) if case.child
                               else run_in_process(bundle, capsys, *options))
    output = out + err
    assert "Traceback" not in output, output
    assert code == case.code, output
    assert seconds < TIME_BOUND_S
    if case.code == 2:
        [line] = err.strip().splitlines()  # one line, on stderr
        assert line.startswith("error: ") and case.rule in line and case.fix in line, err
        return
    lines = out.splitlines()
    assert all(REPORT_LINE.match(line) for line in lines), output  # no finding spills over several lines
    found = [index for index, line in enumerate(lines) if f" {case.rule} " in line]
    assert found, output
    [index] = found[:1]
    assert lines[index].startswith(f"{case.file}:"), lines[index]  # the finding names the file to edit
    assert lines[index + 1].startswith("    fix: ") and case.fix in lines[index + 1], output
    assert lines[-1].startswith("0 errors" if case.code == 0 else tuple(f"{n} error" for n in range(1, 10))), output


def test_an_anchor_block_at_the_top_level_is_not_an_unknown_key(tmp_path):
    """The CLI spares a top-level block that holds only anchors (libs/dyn/convert/normalize.go, isAnchorContainer):
    it is there to be aliased."""
    bundle = tmp_path / "bundle"
    shutil.copytree(GOOD, bundle)
    (bundle / ROOT_FILE).write_text((bundle / ROOT_FILE).read_text() + "\ndefaults: &defaults\n  timeout_seconds: 60\n"
                                     "shared:\n  - &tags {team: ml}\n  - &more {cost: x}\n")
    report = validate_bundle(bundle)
    assert report == {"dev": [], "prod": []}


# ---------------------------------------------------------------- validation time linear in the bundle

def many_jobs_bundle(folder: Path, jobs: int) -> Path:
    """`jobs` jobs, one file each (the CLI's own layout: one resource per *.job.yml), every file with an unknown
    key (a warning) and every job's wheel task without a library (an error): files, merging and reporting all grow."""
    (folder / "resources").mkdir(parents=True)
    (folder / ROOT_FILE).write_text("bundle: {name: many}\ninclude: [resources/*.yml]\n"
                                    "targets: {dev: {default: true}, prod: {mode: production, workspace: "
                                    "{root_path: /Workspace/Shared/many}}}\n")
    for number in range(jobs):
        (folder / "resources" / f"job_{number}.job.yml").write_text(
            f"resource: {{}}\nresources:\n  jobs:\n    job_{number}:\n      name: job {number}\n      tasks:\n"
            f"        - task_key: t\n          existing_cluster_id: abc\n          spark_python_task:\n"
            f"            python_file: ./x.py\n        - task_key: w\n          job_cluster_key: c\n"
            f"          python_wheel_task: {{package_name: p, entry_point: e}}\n      job_clusters:\n"
            f"        - job_cluster_key: c\n          new_cluster: {{spark_version: 17.3.x-scala2.13, "
            f"node_type_id: Standard_D8ds_v5, num_workers: 1}}\n")
    return folder


def _seconds(bundle: Path) -> float:
    """CPU seconds of this process: what the work costs. Wall time also counts the waits for a core that other work
    on the machine causes, by a factor that changes from one measurement to the next."""
    started = time.process_time()
    report = validate_bundle(bundle)
    elapsed = time.process_time() - started
    assert sum(finding.rule == "wheel-task-without-library" for finding in report["dev"]) > 0
    return elapsed


def test_validation_time_is_linear_in_the_number_of_jobs(tmp_path):
    """Ten times the jobs (in ten times the files, with ten times the findings) take well under twenty times as
    long: nothing in loading, merging, checking or reporting is quadratic. The 50,000-job bundle this stands for
    takes seconds, not minutes."""
    small, large = many_jobs_bundle(tmp_path / "small", 80), many_jobs_bundle(tmp_path / "large", 800)
    _seconds(small)  # imports and caches out of the measurement
    small_time = min(_seconds(small) for _ in range(3))  # the least disturbed of three (a shared machine)
    large_time = min(_seconds(large) for _ in range(2))
    assert large_time < 20 * small_time, (small_time, large_time)
