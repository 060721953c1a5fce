"""The generated GitHub Actions workflow parses, and every step it runs exists in the generated project."""

from __future__ import annotations

import re
import shlex
import tomllib

import pytest
import yaml

from distributed_training.compute.runtime import versions

# local code_source_path folders packaged at deploy (databricks/cli v1.11.0), which serverless projects rely on
MINIMUM_CLI = (1, 11, 0)


def steps(workflow):
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def test_workflow_parses_and_its_commands_exist_in_the_project(render):
    project = render(engine="all")
    workflow = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]

    # `on:` reads as True in YAML 1.1: pull requests test, main deploys to dev, a release to prod.
    assert set(workflow[True]) == {"pull_request", "push", "release"}
    assert workflow["jobs"]["deploy"]["needs"] == "test"
    assert workflow["jobs"]["deploy"]["permissions"]["id-token"] == "write"  # OIDC: no stored secret

    for step in steps(workflow):
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+(\.\d+)*", step["uses"]), f"unpinned action {step['uses']}"
            continue
        command = shlex.split(step["run"])
        if command[:3] == ["python", "-m", "my_training"]:
            assert (project / "src" / "my_training" / "__main__.py").is_file()
            assert command[3] in ("validate", "train", "run", "advise")
        for extra in re.findall(r'\.\[(\w+)\]', step["run"]):
            assert extra in extras, f"{step['run']}: no extra {extra!r}"
        if command[:3] == ["python", "-m", "pytest"]:
            assert list((project / "tests").glob("test_*.py"))
        if command[:3] in (["databricks", "bundle", "validate"], ["databricks", "bundle", "deploy"]):
            target = step["run"].split("--target", 1)[1]
            assert "'prod'" in target and "'dev'" in target  # an expression choosing one of the two
            bundle = yaml.safe_load((project / "databricks.yml").read_text())
            assert {"dev", "prod"} <= set(bundle["targets"])
    secrets = re.findall(r"secrets\.", (project / ".github" / "workflows" / "ci.yml").read_text())
    assert secrets == []


@pytest.mark.parametrize("answers", [
    {}, {"engine": "all"}, {"cloud": "aws", "engine": "spark_ml_connect"},
    {"compute": "serverless_gpu", "engine": "deepspeed", "accelerator_type": "GPU_8xH100"},
], ids=lambda answers: "-".join(answers.values()) or "default")
def test_every_workflow_pins_the_cli_of_versions_yaml(render, answers):
    """`databricks/setup-cli@vX` installs CLI version X: the one whose bundle schema the project validates against
    (compute/versions.yaml), and no older than v1.11.0."""
    project = render(**answers)
    workflow = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())
    [pin] = [step["uses"] for step in steps(workflow) if step.get("uses", "").startswith("databricks/setup-cli@")]
    assert pin == f"databricks/setup-cli@v{versions()['databricks_cli']}"
    assert tuple(int(part) for part in pin.split("@v")[1].split(".")) >= MINIMUM_CLI
