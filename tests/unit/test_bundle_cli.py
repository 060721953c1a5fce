"""`validate` on the command line: exit codes 0 / 1 / 2, output, the schema from the environment, `--strict`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import distributed_training
from distributed_training.tooling.bundle.schema import SCHEMA_ENV
from distributed_training.tooling.cli import main

BUNDLES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"


def test_clean_bundle_exits_0_and_says_the_schema_was_skipped(capsys, monkeypatch):
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    assert main(["validate", str(BUNDLES / "good")]) == 0
    out = capsys.readouterr().out
    assert "schema: skipped" in out
    assert out.splitlines()[-1] == "0 errors, 0 warnings (dev: 0 errors, 0 warnings; prod: 0 errors, 0 warnings)"


def test_bundle_dir_defaults_to_the_current_folder(capsys, monkeypatch):
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    monkeypatch.chdir(BUNDLES / "dangling_job_cluster_key")
    assert main(["validate"]) == 1
    assert "[dangling-job-cluster-key]" in capsys.readouterr().out


def test_errors_exit_1_with_file_path_rule_fix_and_a_summary_per_target(capsys, monkeypatch):
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    assert main(["validate", str(BUNDLES / "target_overrides")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "== target prod ==" in lines
    assert "databricks.yml:variables.schema: error [variable-without-value]" in "\n".join(lines)
    assert ("databricks.yml:resources.jobs.train.job_clusters[0].new_cluster.num_workers: warning "
            "[single-node-incomplete]") in "\n".join(lines)
    assert any(line.strip().startswith("fix: ") for line in lines)
    assert lines[-1] == "1 error, 1 warning (dev: 0 errors, 0 warnings; prod: 1 error, 1 warning)"


def test_strict_fails_on_warnings_as_the_clis_strict_does(capsys, monkeypatch):
    """cmd/bundle/validate.go: `--strict` "Treat warnings as errors": the findings print as they are, the exit is 1."""
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    assert main(["validate", str(BUNDLES / "unknown_field_typed")]) == 0
    warned = capsys.readouterr().out
    assert main(["validate", str(BUNDLES / "unknown_field_typed"), "--strict"]) == 1
    captured = capsys.readouterr()
    assert captured.out == warned and "warning [unknown-field] unknown field 'autotermination_minute'" in warned
    assert captured.err == "error: 1 warning found, and --strict allows none\n"
    assert main(["validate", str(BUNDLES / "good"), "--strict"]) == 0


def test_target_option_checks_that_target_only(capsys, monkeypatch):
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    assert main(["validate", str(BUNDLES / "target_overrides"), "--target", "dev"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "0 errors, 0 warnings (dev: 0 errors, 0 warnings)"


def test_bad_usage_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    assert main(["validate", str(tmp_path)]) == 2
    assert "no databricks.yml" in capsys.readouterr().err
    assert main(["validate", str(BUNDLES / "good"), "--target", "staging"]) == 2
    assert "'staging' is not declared" in capsys.readouterr().err
    assert main(["validate", str(BUNDLES / "good"), "--schema", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the bundle schema" in capsys.readouterr().err


def test_schema_path_comes_from_the_environment(tmp_path, capsys, monkeypatch):
    (tmp_path / "schema.json").write_text("{not json")
    monkeypatch.setenv(SCHEMA_ENV, str(tmp_path / "schema.json"))
    assert main(["validate", str(BUNDLES / "good")]) == 2
    assert str(tmp_path / "schema.json") in capsys.readouterr().err


def test_python_dash_m_runs_validate():
    source_root = Path(distributed_training.__file__).resolve().parents[1]
    environment = {key: value for key, value in os.environ.items() if key != SCHEMA_ENV}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source_root), environment.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "distributed_training", "validate",
                             str(BUNDLES / "wheel_entry_point_missing")],
                            capture_output=True, text=True, env=environment, timeout=60)
    assert result.returncode == 1, result.stderr
    assert ("resources/train.yml:resources.jobs.train.tasks[0].python_wheel_task.entry_point: error "
            "[wheel-entry-point-missing]") in result.stdout
