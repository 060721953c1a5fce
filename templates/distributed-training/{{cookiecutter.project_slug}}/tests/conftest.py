import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture
def train(tmp_path):
    """Run `python -m {{ cookiecutter.package_name }} train ... --local` as a job would run `train`; its metrics.json."""

    def run(*options: str) -> dict:
        output = tmp_path / "run"
        environment = {**os.environ, "PYTHONPATH": str(PROJECT)}  # the examples/ folder, for --task examples.*
        completed = subprocess.run([sys.executable, "-m", "{{ cookiecutter.package_name }}", "train", "--local",
                                    "--output-dir", str(output), *options], cwd=PROJECT, env=environment,
                                   capture_output=True, text=True, timeout=900)
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
        return json.loads((output / "metrics.json").read_text())

    return run
