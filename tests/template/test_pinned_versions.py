"""Every environment installs the versions the tests ran, from one definition (compute/versions.yaml `packages`):
this repository's own pins (pyproject.toml's `local` extra, scripts/bootstrap.sh), the serverless environments'
dependencies (the CLI's bundle schema, an environment's `dependencies`: "List of pip dependencies, as supported by the
version of pip in this environment") and a generated project's `local` extra and README."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from distributed_training.compute.runtime import versions

REPOSITORY = Path(__file__).resolve().parents[2]
PINNED = versions()["packages"]
PROJECT_WHEEL = "../dist/*.whl"  # the project's own wheel, built at deploy


def pins(requirements: list[str]) -> dict[str, str]:
    """name -> the version a list of requirements pins with `==` (an unpinned one fails here)."""
    found = {}
    for line in requirements:
        requirement = Requirement(line)
        [specifier] = requirement.specifier
        assert specifier.operator == "==", f"{line}: not pinned"
        found[requirement.name] = specifier.version
    return found


def test_this_repositorys_pins_are_versions_yaml():
    local = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["optional-dependencies"]["local"]
    pinned_here = pins([line for line in local if "==" in line])
    assert pinned_here == {name: PINNED[name] for name in ("pyspark", "ray", "mlflow-skinny", "transformers", "peft",
                                                           "tokenizers", "safetensors")}
    bootstrap = (REPOSITORY / "scripts" / "bootstrap.sh").read_text()
    assert dict(re.findall(r"install [^\n]*?\b(torch|deepspeed)==([\w.]+)", bootstrap)) == {
        name: PINNED[name] for name in ("torch", "deepspeed")}


@pytest.mark.parametrize("engine", ["torch_distributor", "deepspeed"])
def test_every_serverless_environment_pins_every_dependency(rendered, engine):
    project = rendered(compute="serverless_gpu", engine=engine, accelerator_type="GPU_8xH100")
    job = yaml.safe_load((project / "resources" / f"train_{engine}.job.yml").read_text())["resources"]["jobs"]
    [environments] = [job_settings["environments"] for job_settings in job.values()]
    expected = {"staging": {"mlflow-skinny": PINNED["mlflow-skinny"]},
                "training": {"mlflow-skinny": PINNED["mlflow-skinny"],
                             **({"deepspeed": PINNED["deepspeed"]} if engine == "deepspeed" else {})}}
    for environment in environments:
        dependencies = environment["spec"]["dependencies"]
        assert dependencies[0] == PROJECT_WHEEL
        assert pins(dependencies[1:]) == expected[environment["environment_key"]]


@pytest.mark.parametrize("engine", ["torch_distributor", "all"])
def test_the_generated_local_extra_pins_what_the_tests_ran(rendered, engine):
    local = tomllib.loads((rendered(engine=engine) / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["local"]
    pinned = pins([line for line in local if "==" in line])
    assert pinned == {name: PINNED[name] for name in ("pyspark", "torch", "mlflow-skinny",
                                                      *(["ray"] if engine == "all" else []))}
    for name in ("README.md", ".github/workflows/ci.yml"):  # torch first, before the extras
        assert f"pip install torch=={PINNED['torch']} " in (rendered(engine=engine) / name).read_text(), name


@pytest.mark.parametrize("answers", [{"engine": "torch_distributor"}, {"engine": "deepspeed"}, {"engine": "all"},
                                     {"engine": "deepspeed", "compute": "serverless_gpu"}],
                         ids=lambda answers: "-".join(answers.values()))
def test_every_environment_of_a_deepspeed_job_installs_deepspeed(rendered, answers):
    """Locally and in CI the README's and the workflow's install (DeepSpeed builds against the installed torch, so
    after it and without build isolation); on serverless GPU the training environment; on a cluster Databricks
    Runtime ML, which includes DeepSpeed from 14.0 ML ("Distributed training with DeepSpeed distributor", Databricks
    docs). A project without the engine installs none."""
    project = rendered(**answers)
    has_deepspeed = answers["engine"] in ("deepspeed", "all")
    install = f"--no-build-isolation deepspeed=={PINNED['deepspeed']}"
    for name in ("README.md", ".github/workflows/ci.yml"):
        text = (project / name).read_text()
        assert (install in text) == has_deepspeed, name
        if has_deepspeed:
            assert text.index(f"install torch=={PINNED['torch']}") < text.index(install), name
            assert "install setuptools" in text, name
    if not has_deepspeed:
        return
    job = yaml.safe_load((project / "resources" / "train_deepspeed.job.yml").read_text())["resources"]["jobs"]
    [settings] = job.values()
    if answers.get("compute") == "serverless_gpu":
        [training] = [spec["spec"] for spec in settings["environments"] if spec["environment_key"] == "training"]
        assert f"deepspeed=={PINNED['deepspeed']}" in training["dependencies"]
    else:
        [cluster] = [cluster["new_cluster"] for cluster in settings["job_clusters"]]
        assert cluster["use_ml_runtime"] is True
        assert float(cluster["spark_version"].split(".x")[0]) >= 14.0


HUGGING_FACE = ("transformers", "peft", "tokenizers", "safetensors")


def test_a_fine_tuning_project_pins_the_hugging_face_packages_wherever_it_installs_them(rendered):
    """Locally the `local` extra; on a cluster each job that loads the model (its training jobs and the score job,
    not Spark ML's) and each notebook, Databricks Runtime 17.3 LTS ML shipping no peft and transformers 4.51.3; on
    serverless GPU the training environment, and the staging one what its executors tokenize with (no peft: it
    needs torch, which staging has not)."""
    wanted = {name: PINNED[name] for name in HUGGING_FACE}
    project = rendered(task="fine_tune", engine="all")
    local = tomllib.loads((project / "pyproject.toml").read_text())["project"]["optional-dependencies"]["local"]
    assert {name: version for name, version in pins([line for line in local if "==" in line]).items()
            if name in wanted} == wanted
    for path in (project / "resources").glob("*.job.yml"):
        [(key, job)] = yaml.safe_load(path.read_text())["resources"]["jobs"].items()
        libraries = [library for task in job["tasks"] for library in task["libraries"]]
        assert libraries[0] == {"whl": PROJECT_WHEEL}, key
        assert pins([library["pypi"]["package"] for library in libraries[1:]]) == (
            {} if key == "train_spark_ml_connect" else wanted), key
    for path in (project / "notebooks").glob("*.py"):
        [install] = [line for line in path.read_text().splitlines() if "%pip install" in line]
        assert pins(install.split("%pip install --quiet ..")[1].split()) == (
            {} if path.stem == "train_spark_ml_connect" else wanted), path.name
    serverless = rendered(task="fine_tune", compute="serverless_gpu", engine="deepspeed")
    job = yaml.safe_load((serverless / "resources" / "train_deepspeed.job.yml").read_text())["resources"]["jobs"]
    environments = {environment["environment_key"]: pins(environment["spec"]["dependencies"][1:])
                    for environment in job["train_deepspeed"]["environments"]}
    assert environments == {
        "staging": {"mlflow-skinny": PINNED["mlflow-skinny"],
                    **{name: PINNED[name] for name in ("transformers", "tokenizers", "safetensors")}},
        "training": {"mlflow-skinny": PINNED["mlflow-skinny"], "deepspeed": PINNED["deepspeed"], **wanted}}
