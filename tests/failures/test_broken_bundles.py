"""`validate` on broken bundles reports, never crashes: YAML syntax errors, every value of a good bundle replaced by
each wrong type, and files that are missing, empty, binary or in the wrong place.

Through the command itself (in process): exit 1 with findings, or 2 for an unusable argument, never a traceback.
Each broken case asserts its finding (the rule in brackets and words of its fix), not merely the word "error",
which the summary line "0 errors" also holds. Hostile input (alias bombs, deep nesting, FIFOs, huge bundles) is in
test_hostile_bundles.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from distributed_training.tooling.cli import main

GOOD = Path(__file__).resolve().parents[1] / "fixtures" / "bundles" / "good"
ROOT_FILE, JOB_FILE = "databricks.yml", "resources/train.job.yml"
WRONG_VALUES = [None, 7, "text", ["a", "list"], {"a": "mapping"}]

YAML_SYNTAX_ERRORS = {
    "unclosed quote": 'bundle:\n  name: "good_training\n',
    "tab indentation": "bundle:\n\tname: good_training\n",
    "bad indentation": "bundle:\n  name: good_training\n   extra: 1\n",
    "unclosed flow list": "bundle:\n  name: good_training\ninclude: [resources/*.yml\n",
    "unclosed flow mapping": "bundle: {name: good_training\n",
    "stray colon": "bundle:\n  name: good: training\n",
    "document of a list": "- bundle\n- include\n",
    "document of a scalar": "just text\n",
    "document of a number": "42\n",
    "undefined alias": "bundle: *missing\n",
    "unknown tag": "bundle: !!python/object:os.system {}\n",
    "duplicate anchors": "a: &x 1\nb: &x 2\nbundle: {name: g}\n",
    "control characters": "bundle:\n  name: \x07\x08\n",
    "template markers": "bundle:\n  name: {{ cookiecutter.project_slug }}\n",
}
# The finding each of them gives: its rule as printed, and words of its fix.
SYNTAX_FIX = ("[yaml-syntax]", "fix the YAML there")
NOT_A_MAPPING = ("[not-a-mapping]", "a bundle file is a YAML mapping")
EXPECTED_FINDING = {case: NOT_A_MAPPING if case.startswith("document of a") else SYNTAX_FIX
                    for case in YAML_SYNTAX_ERRORS}


# The CLI's own checks decide whether an empty databricks.yml is a bundle; here it must only not crash.
EMPTY_ROOT_FILES = {"empty document": "", "comments only": "# nothing here\n", "only a document marker": "---\n"}


def _paths(tree, prefix=()):
    """Every path to a value in a YAML tree (mapping keys and list positions)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield (*prefix, index)
            yield from _paths(value, (*prefix, index))


def _replaced(tree, path, value):
    tree = yaml.safe_load(yaml.safe_dump(tree))  # a deep copy
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return tree


def _mutations():
    for file in (ROOT_FILE, JOB_FILE):
        tree = yaml.safe_load((GOOD / file).read_text())
        for path in _paths(tree):
            for value in WRONG_VALUES:
                yield file, path, value


MUTATIONS = list(_mutations())


def validate(bundle_dir, capsys, *options: str) -> tuple[int, str]:
    """Run `validate` as the command line does; a traceback fails the test by raising here."""
    code = main(["validate", str(bundle_dir), *options])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def assert_finding(output: str, file: str, rule: str, fix: str) -> None:
    """`output` holds a finding of `rule` in `file` whose fix line has `fix`."""
    lines = output.splitlines()
    found = [index for index, line in enumerate(lines) if line.startswith(f"{file}") and f" {rule} " in line]
    assert found, f"no {rule} finding for {file} in:\n{output}"
    assert any(fix in lines[index + 1] for index in found if index + 1 < len(lines)), output


@pytest.fixture
def bundle(tmp_path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(GOOD, copy)
    return copy


def test_the_good_bundle_is_good(bundle, capsys):
    assert validate(bundle, capsys)[0] == 0


@pytest.mark.parametrize("case", YAML_SYNTAX_ERRORS)
def test_yaml_that_is_not_a_bundle_is_reported_with_its_file(bundle, capsys, case):
    (bundle / ROOT_FILE).write_text(YAML_SYNTAX_ERRORS[case])
    code, output = validate(bundle, capsys)
    assert code == 1, output
    assert_finding(output, ROOT_FILE, *EXPECTED_FINDING[case])
    assert "bundle-name-missing" not in output  # a file that could not be read is not an empty one


@pytest.mark.parametrize("case", EMPTY_ROOT_FILES)
def test_an_empty_root_file_is_refused_for_its_missing_bundle_name(bundle, capsys, case):
    """The CLI stops without bundle.name (bundle/config/mutator/default_workspace_root.go)."""
    (bundle / ROOT_FILE).write_text(EMPTY_ROOT_FILES[case])
    code, output = validate(bundle, capsys)
    assert code == 1, output
    assert_finding(output, ROOT_FILE, "[bundle-name-missing]", "set bundle: {name:")


@pytest.mark.parametrize("case", YAML_SYNTAX_ERRORS)
def test_broken_yaml_in_an_included_file_is_reported_with_its_file(bundle, capsys, case):
    (bundle / JOB_FILE).write_text(YAML_SYNTAX_ERRORS[case])
    code, output = validate(bundle, capsys)
    assert code == 1, output
    assert_finding(output, JOB_FILE, *EXPECTED_FINDING[case])


def test_every_value_replaced_by_every_wrong_type_is_reported_or_accepted_never_a_crash(tmp_path, capsys,
                                                                                       monkeypatch):
    """One bundle folder, rewritten per mutation (a folder per case would cost more than the check). The JSON
    schema layer, when CI provides the schema, sees every fifth mutation: all of them would take minutes."""
    schema = os.environ.get("DATABRICKS_BUNDLE_SCHEMA")
    monkeypatch.delenv("DATABRICKS_BUNDLE_SCHEMA", raising=False)
    crashed, outcomes = [], {"error": 0, "warning": 0, "clean": 0}
    for number, (file, path, value) in enumerate(MUTATIONS):
        bundle = tmp_path / "bundle"
        shutil.rmtree(bundle, ignore_errors=True)
        shutil.copytree(GOOD, bundle)
        tree = yaml.safe_load((GOOD / file).read_text())
        (bundle / file).write_text(yaml.safe_dump(_replaced(tree, path, value)))
        try:
            code, output = validate(bundle, capsys, *(["--schema", schema] if schema and number % 5 == 0 else []))
        except Exception as error:  # noqa: BLE001 - collected, so one run lists every crash
            crashed.append(f"{file}:{'.'.join(map(str, path))} = {value!r}: {type(error).__name__}: {error}")
            continue
        assert code in (0, 1), f"{file}:{path} = {value!r} exited {code}: {output}"
        outcome = "error" if code == 1 else "clean" if " 0 warnings (" in output.splitlines()[-1] else "warning"
        outcomes[outcome] += 1
    assert crashed == [], "\n".join(crashed)
    # Most wrong values are reported even without the JSON schema (which CI adds): as errors where the CLI refuses
    # them (a missing bundle name, a dangling job cluster, a guard), as warnings where its loader drops them with one
    # (libs/dyn/convert/normalize.go); a description may well be a number.
    assert outcomes["error"] > len(MUTATIONS) / 5 and outcomes["error"] + outcomes["warning"] > len(MUTATIONS) / 2, \
        outcomes


SERVERLESS_JOB = {"resources": {"jobs": {"finetune": {
    "name": "finetune",
    "environments": [{"environment_key": "gpu", "spec": {"environment_version": "4", "dependencies": ["x"]}}],
    "tasks": [
        {"task_key": "stage", "environment_key": "gpu", "python_wheel_task": {
            "package_name": "good_training", "entry_point": "train", "parameters": ["--engine", "deepspeed"]}},
        {"task_key": "sweep", "depends_on": [{"task_key": "stage"}], "for_each_task": {"inputs": "[1]", "task": {
            "task_key": "train", "environment_key": "gpu", "ai_runtime_task": {
                "experiment": "finetune", "code_source_path": "/Workspace/Shared/code",
                "deployments": [{"name": "train", "command_path": "${workspace.file_path}/src/command.sh",
                                 "compute": {"accelerator_type": "GPU_8xH100", "accelerator_count": 8}}]}}}},
    ]}}, "clusters": {"shared": {"spark_version": "17.3.x-scala2.13", "node_type_id": "Standard_NC64as_T4_v3",
                                 "kind": "CLASSIC_PREVIEW", "use_ml_runtime": True, "is_single_node": True,
                                 "driver_node_type_id": "Standard_D8ds_v5"}}}}


def test_every_value_of_a_serverless_job_replaced_by_every_wrong_type_is_never_a_crash(tmp_path, capsys,
                                                                                       monkeypatch):
    """The same for the shapes the classic bundle lacks: an ai_runtime_task inside a for_each_task, its
    deployments and paths, and an all-purpose cluster in the new (CLASSIC_PREVIEW) form. Without the schema."""
    monkeypatch.delenv("DATABRICKS_BUNDLE_SCHEMA", raising=False)
    file = "resources/finetune.job.yml"
    bundle = tmp_path / "bundle"
    shutil.copytree(GOOD, bundle)
    (bundle / "src" / "command.sh").write_text("torchrun -m good_training\n")
    (bundle / file).write_text(yaml.safe_dump(SERVERLESS_JOB))
    code, output = validate(bundle, capsys)
    assert code == 0 and "0 errors, 0 warnings" in output, output  # the unmutated job is clean
    crashed = []
    for path in _paths(SERVERLESS_JOB):
        for value in WRONG_VALUES:
            (bundle / file).write_text(yaml.safe_dump(_replaced(SERVERLESS_JOB, path, value)))
            try:
                code, output = validate(bundle, capsys)
            except Exception as error:  # noqa: BLE001 - collected, so one run lists every crash
                crashed.append(f"{'.'.join(map(str, path))} = {value!r}: {type(error).__name__}: {error}")
                continue
            assert code in (0, 1), f"{path} = {value!r} exited {code}: {output}"
    assert crashed == [], "\n".join(crashed)


# breakage -> (exit code, file the finding names, rule, words of the fix); exit 2 is a usage error on stderr.
BREAKAGES = {
    "no root file": (2, None, "no databricks.yml", "pass the folder that holds databricks.yml"),
    "root file is a folder": (2, None, "no databricks.yml", "pass the folder that holds databricks.yml"),
    "folder is a file": (2, None, "no databricks.yml", "pass the folder that holds databricks.yml"),
    "no folder": (2, None, "no databricks.yml", "pass the folder that holds databricks.yml"),
    # process_root_includes.go reads every match of a glob: a folder among them is an error, not skipped
    "included file is a folder": (1, JOB_FILE, "[unreadable-file]", "include only YAML or JSON files"),
    "included file is binary": (1, JOB_FILE, "[unreadable-file]", "make the file readable UTF-8 text"),
    "included file is empty": (0, None, "0 errors", None),  # the CLI reads an empty file as an empty mapping
    "root file is binary": (1, ROOT_FILE, "[unreadable-file]", "make the file readable UTF-8 text"),
    # an include without glob characters must match (process_root_includes.go: "does not match any files")
    "include names a missing file": (1, ROOT_FILE, "[include-file-missing]", "create the file, fix the path"),
    "include is a mapping": (1, ROOT_FILE, "[include-not-a-list]", "write include: ["),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_missing_or_unreadable_files_are_reported(bundle, capsys, breakage):
    target = bundle
    if breakage == "no root file":
        (bundle / ROOT_FILE).unlink()
    elif breakage == "root file is a folder":
        (bundle / ROOT_FILE).unlink()
        (bundle / ROOT_FILE).mkdir()
    elif breakage == "folder is a file":
        target = bundle / ROOT_FILE
    elif breakage == "no folder":
        target = bundle / "nowhere"
    elif breakage == "included file is a folder":
        (bundle / JOB_FILE).unlink()
        (bundle / JOB_FILE).mkdir()
    elif breakage == "included file is binary":
        (bundle / JOB_FILE).write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 20)
    elif breakage == "included file is empty":
        (bundle / JOB_FILE).write_text("")
    elif breakage == "root file is binary":
        (bundle / ROOT_FILE).write_bytes(b"\xff\xfe\x00\x00garbage")
    elif breakage == "include names a missing file":
        (bundle / ROOT_FILE).write_text((bundle / ROOT_FILE).read_text().replace("resources/*.yml", "resources/gone.yml"))
    elif breakage == "include is a mapping":
        (bundle / ROOT_FILE).write_text(
            (bundle / ROOT_FILE).read_text().replace("include:\n  - resources/*.yml", "include:\n  files: x"))
    code, output = validate(target, capsys)
    expected_code, file, rule, fix = BREAKAGES[breakage]
    assert code == expected_code, output
    assert "Traceback" not in output
    if expected_code == 2:
        assert len(output.strip().splitlines()) == 1 and rule in output and fix in output, output
    elif expected_code == 0:
        assert output.splitlines()[-1].startswith("0 errors"), output
    else:
        assert_finding(output, file, rule, fix)
