"""A generated project, installed into a fresh venv the way its README says, passes its own tests.

Its tests include a real local TorchDistributor training run with 2 processes. Slow (a venv and pyspark).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine


def run(command, cwd, env=None):
    completed = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert completed.returncode == 0, f"{' '.join(map(str, command))}\n{completed.stdout[-4000:]}\n{completed.stderr[-4000:]}"
    return completed


def test_generated_project_installs_into_a_fresh_venv_and_passes_its_own_tests(render, tmp_path):
    project = render(tmp_path / "out")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=project)
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "--quiet", "torch==2.13.0"], cwd=project)
    run([python, "-m", "pip", "install", "--quiet", "-e", ".[test]"], cwd=project)

    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    result = run([python, "-m", "pytest", "-v", "-p", "no:cacheprovider"], cwd=project, env=env)
    assert " passed" in result.stdout and "failed" not in result.stdout
    assert "test_local_training_loss_goes_down" in result.stdout
