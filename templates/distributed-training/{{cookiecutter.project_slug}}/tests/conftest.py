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
{%- if cookiecutter.task == "fine_tune" %}


@pytest.fixture(scope="session")
def base_model(tmp_path_factory) -> str:
    """A small random-weight model and its tokenizer, trained on the sample table's kind of text and saved in Hugging
    Face format, as a volume's model folder holds them (task.py's save_small_model: nothing downloaded)."""
    import random

    from {{ cookiecutter.package_name }}.task import save_small_model, sentence

    folder = tmp_path_factory.mktemp("base_model")
    rng = random.Random(0)
    save_small_model(str(folder), [sentence(rng) for _ in range(2000)])
    return str(folder)
{%- endif %}
