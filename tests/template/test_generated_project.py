"""A generated causal_lm project, committed and cloned to another path (what CI and a teammate get), installed into a
fresh venv the way its README says, trains with DeepSpeed and (in its own tests) TorchDistributor on local Spark and
beats the trivial predictor, and passes its own tests; and so does a fine_tune project, whose tests fine-tune a small
model they make (conftest.py).

Slow (minutes): one venv for each project, with torch (a CPU build), the project with its `test` extra (pyspark,
MLflow, Ray, transformers and peft for fine_tune, and the tool: from the wheel generation built into the project's
`wheels/`, as the generated README says for a project generated from a checkout without a remote), then for the
causal_lm project (engine=all) DeepSpeed built against that torch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_training.compute.runtime import versions

pytestmark = [pytest.mark.engine, pytest.mark.timeout(3600)]
TORCH, DEEPSPEED = (f"{name}=={versions()['packages'][name]}" for name in ("torch", "deepspeed"))
REPOSITORY = Path(__file__).resolve().parents[2]
RATIO = 0.9  # held-out loss against the trivial predictor's (the unigram model) on the same rows


def run(command, cwd, env=None, timeout=1800):
    completed = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert completed.returncode == 0, (f"{' '.join(map(str, command))}\n{completed.stdout[-4000:]}\n"
                                       f"{completed.stderr[-4000:]}")
    return completed


@pytest.fixture(scope="module")
def installed(tmp_path_factory, render_into):
    """(project, its venv's python, the environment to run it in): engine=all, task=causal_lm, installed once."""
    return install(tmp_path_factory.mktemp("generated"), render_into, engine="all", task="causal_lm")


@pytest.fixture(scope="module")
def installed_fine_tune(tmp_path_factory, render_into, installed):
    """The same for task=fine_tune and one engine, a package of another name installed into the causal_lm project's
    venv (its own extra adds the Hugging Face packages): a second venv would add 6 minutes of installing the same."""
    _, python, _ = installed
    return install(tmp_path_factory.mktemp("generated"), render_into, python, project_name="Fine Tuning",
                   engine="torch_distributor", task="fine_tune")


def install(root, render_into, python=None, **answers):
    """The project of these answers, committed, cloned elsewhere and installed, into a venv of its own (or `python`'s
    venv, which has torch)."""
    generated = render_into(root / "out", **answers)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for command in (["init", "--quiet"], ["add", "."], ["commit", "--quiet", "-m", "generated"]):
        run([*git, *command], cwd=generated)
    project = root / "elsewhere" / generated.name
    run(["git", "clone", "--quiet", str(generated), str(project)], cwd=root)
    shutil.rmtree(generated)  # nothing of the machine that generated it may be needed
    requirement = next(line for line in (project / "pyproject.toml").read_text().splitlines()
                       if "distributed-training" in line)
    assert "file:" not in requirement and str(REPOSITORY) not in requirement, requirement
    if python is None:
        venv = root / "venv"
        run([sys.executable, "-m", "venv", str(venv)], cwd=project)
        python = str(venv / "bin" / "python")
        run([python, "-m", "pip", "install", "--quiet", TORCH], cwd=project)  # first, as the README says: CPU is enough
    pip = [python, "-m", "pip", "install", "--quiet"]
    run([*pip, "--find-links", "wheels", "-e", ".[test]"], cwd=project)  # the project's own, committed with it
    if answers["engine"] in ("deepspeed", "all"):
        run([*pip, "--no-build-isolation", DEEPSPEED], cwd=project)  # builds against the torch installed above
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Its DeepSpeed op built in a folder of its own: torch's default one is shared by every interpreter of the machine,
    # and a build for this throwaway venv's paths would make the next one there rebuild.
    env["TORCH_EXTENSIONS_DIR"] = str(root / "torch_extensions")
    return project, python, env


def test_the_cloned_project_installs_as_its_own_and_gets_the_tool_from_the_wheel_folder(installed):
    project, python, env = installed
    where = run([python, "-c", "import my_training, distributed_training; print(my_training.__file__); "
                 "print(distributed_training.__file__)"], cwd=project.parent, env=env).stdout.split()
    assert where[0] == str(project / "src" / "my_training" / "__init__.py")
    assert not where[1].startswith(str(project))  # the tool is installed beside it, not carried in it
    validated = run([python, "-m", "distributed_training", "validate", "."], cwd=project, env=env)  # CI's step
    assert "\n0 errors" in validated.stdout, validated.stdout  # exit 0 (run checks it): no error in either target


def test_the_language_model_trains_locally_with_deepspeed_and_beats_the_trivial_predictor(installed, tmp_path):
    """DeepSpeed, whose CPU op the venv builds; TorchDistributor trains the same way in the project's own tests."""
    project, python, env = installed
    output = tmp_path / "deepspeed"
    run([python, "-m", "my_training", "train", "--engine", "deepspeed", "--local", "--epochs", "3",
         "--output-dir", str(output)], cwd=project, env=env, timeout=1200)
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["held_out_loss"] < RATIO * metrics["baseline_loss"], metrics.get("final", metrics)
    assert metrics["world_size"] == 2  # --local: two CPU processes by default


def test_the_project_passes_its_own_tests(installed):
    project, python, env = installed
    # TorchDistributor's run of the language model is this one (the DeepSpeed one is the test above)
    assert '"--engine", "torch_distributor"' in (project / "tests" / "test_train.py").read_text()
    result = run([python, "-m", "pytest", "-v", "-p", "no:cacheprovider"], cwd=project, env=env, timeout=2400)
    for name in ("test_bundle_validates[dev]", "test_bundle_validates[prod]",
                 "test_the_task_trains_and_beats_the_trivial_predictor",
                 "test_a_recurrent_language_model_trains_through_the_same_loop"):  # the causal_lm project's
        assert f"{name} PASSED" in result.stdout, result.stdout[-3000:]
    assert " failed" not in result.stdout and " skipped" not in result.stdout


def test_a_fine_tuning_project_passes_its_own_tests(installed, installed_fine_tune):
    """Its tests make a small model (task.py's save_small_model), fine-tune it locally with --base-model and beat the
    trivial predictor and the base model; its bundle validates (warning that base_model is empty). Its worked example
    (a language model of its own) and the example's test are the causal_lm project's, but for the package's name, and
    run on the same engine, which carries the same modules: that project's own tests run them, this one does not run
    them again (a third `train --local`, a minute and a half)."""
    project, python, env = installed_fine_tune
    causal_lm, _, _ = installed
    for name in ("examples/recurrent_language_model.py", "tests/test_bring_your_own_model.py"):
        assert (project / name).read_text().replace("fine_tuning", "my_training") == (causal_lm / name).read_text()
    runtime = project / "src" / "fine_tuning"
    for module in runtime.rglob("*.py"):
        if module.name not in ("__init__.py", "__main__.py", "task.py"):  # the project's own and the task
            assert module.read_text() == (causal_lm / "src" / "my_training" / module.relative_to(runtime)).read_text()
    example = "tests/test_bring_your_own_model.py::test_a_recurrent_language_model_trains_through_the_same_loop"
    result = run([python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--deselect", example], cwd=project, env=env,
                 timeout=2400)
    for name in ("test_bundle_validates[dev]", "test_bundle_validates[prod]",
                 "test_the_task_trains_and_beats_the_trivial_predictor"):
        assert f"{name} PASSED" in result.stdout, result.stdout[-3000:]
    assert " 1 deselected" in result.stdout and " failed" not in result.stdout and " skipped" not in result.stdout
