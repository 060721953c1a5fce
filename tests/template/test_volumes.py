"""Where runs write, per target: dev and prod use different Unity Catalog volumes, and each developer their own.

Development mode prefixes jobs, clusters, experiments, models and schemas with the user, but not volumes
(bundle/config/mutator/resourcemutator/apply_presets.go in databricks/cli v1.13.0): so the dev target names the
volume after `${workspace.current_user.short_name}` itself, and every job writes under
`${resources.volumes.training.name}`. Production deploys to the service principal's folder, whoever deploys it.
The bundle is read as the CLI reads it: target merged over the root, variables resolved, references substituted.
"""

from __future__ import annotations

import pytest

from distributed_training.tooling.bundle.loader import load_bundle
from distributed_training.tooling.bundle.references import Resolver, substitute
from distributed_training.tooling.bundle.variables import target_variables

CURRENT_USER = "${workspace.current_user.short_name}"
VARIANTS = [{}, {"engine": "all"}, {"compute": "serverless_gpu", "engine": "deepspeed"}]


def resolved(project, target: str) -> tuple[dict, dict]:
    """(the target's tree as written, the same with every reference known before deploy substituted)."""
    tree = load_bundle(project).target_tree(target)
    return tree, substitute(tree, Resolver(tree, target, target_variables(tree, environ={})))


def options(tree: dict, name: str) -> list[tuple[str, str]]:
    """(--engine, the option's value) of every wheel task that passes the option."""
    found = []
    for job in tree["resources"]["jobs"].values():
        for task in job["tasks"]:
            parameters = task.get("python_wheel_task", {}).get("parameters", [])
            given = dict(zip(parameters, parameters[1:]))  # each option with the word after it
            if name in given:
                found.append((given["--engine"], given[name]))
    return found


def output_dirs(tree: dict) -> list[str]:
    return [value for _, value in options(tree, "--output-dir")]


@pytest.mark.parametrize("answers", VARIANTS, ids=lambda answers: "-".join(answers.values()) or "default")
def test_dev_and_prod_write_to_different_volumes_and_dev_to_one_per_user(render, answers):
    project = render(**answers)
    (dev_written, dev), (prod_written, prod) = resolved(project, "dev"), resolved(project, "prod")
    dev_volume = dev["resources"]["volumes"]["training"]["name"]
    prod_volume = prod["resources"]["volumes"]["training"]["name"]

    assert dev_written["resources"]["volumes"]["training"]["name"] == "${var.volume}"
    assert CURRENT_USER in dev_volume and dev_volume.startswith("dev_")
    assert "${" not in prod_volume and prod_volume != dev_volume
    assert "current_user" not in prod_written["workspace"]["root_path"]
    assert prod["workspace"]["root_path"] == "/Workspace/Users/${var.service_principal}/.bundle/my-training/prod"

    for written, tree, volume in ((dev_written, dev, dev_volume), (prod_written, prod, prod_volume)):
        assert output_dirs(written), "every variant stages and trains into the volume"
        for engine_dir in output_dirs(written):
            assert engine_dir.startswith("/Volumes/${var.catalog}/${var.schema}/${resources.volumes.training.name}/")
        for engine_dir in output_dirs(tree):
            assert engine_dir.startswith(f"/Volumes/main/default/{volume}/")
    if "score" in dev["resources"]["jobs"]:  # and so does the score job's output table, by default
        tables = [{item["name"]: item["default"] for item in tree["resources"]["jobs"]["score"]["parameters"]}[
            "output_table"] for tree in (dev, prod)]
        assert tables == [f"main.default.dev_{CURRENT_USER}_my_training_scores", "main.default.my_training_scores"]
    # one MLflow experiment per engine, in the target's own root path
    experiments = options(dev_written, "--mlflow-experiment")
    assert experiments and all(experiment == f"${{workspace.root_path}}/my-training-{engine}"
                               for engine, experiment in experiments)


def test_prod_grants_the_principal_the_volume_and_says_that_grants_revoke_the_rest(rendered):
    """Bundle grants are authoritative: a deploy revokes the privileges of every principal it does not list
    (databricks/cli v1.13.0 bundle/direct/dresources/grants.go, removedGrantPrincipals), readers added by hand too.
    The principal gets the volume from the bundle; what lies outside it (catalog, schema, table) the README lists."""
    project = rendered()
    _, prod = resolved(project, "prod")
    assert prod["resources"]["volumes"]["training"]["grants"] == [
        {"principal": "${var.service_principal}", "privileges": ["READ_VOLUME", "WRITE_VOLUME"]}]
    assert "revokes those of any principal not listed" in (project / "databricks.yml").read_text()
    readme = " ".join((project / "README.md").read_text().split())
    assert "revokes any other principal's, including readers added by hand" in readme
    assert all(grant in readme for grant in ("`USE CATALOG`", "`USE SCHEMA`", "`CREATE VOLUME`", "`SELECT`"))


@pytest.mark.parametrize("answers", [{}, {"compute": "serverless_gpu"}], ids=["classic", "serverless"])
def test_the_readme_lists_every_privilege_the_jobs_use_outside_the_bundle(rendered, answers):
    """What a job does that Unity Catalog guards (Databricks docs, "Unity Catalog privileges and securable objects"):
    `--register-model` creates a model version (CREATE MODEL on its schema); the score job writes its output table
    (CREATE TABLE on the schema; MODIFY on a table the principal does not own), reads the tables it scores (SELECT) and
    the registered model it may be given (EXECUTE)."""
    project = rendered(**answers)
    readme = " ".join((project / "README.md").read_text().split())
    needed = ["`CREATE MODEL`"]
    if (project / "resources" / "score.job.yml").exists():
        score = (project / "resources" / "score.job.yml").read_text()
        assert "--output-table" in score and "{{job.parameters.model}}" in score
        needed += ["`CREATE TABLE`", "`MODIFY`", "`EXECUTE`"]
    assert [grant for grant in needed if grant not in readme] == []
    assert ("`EXECUTE`" in readme) == (answers == {})  # a serverless project has no score job to grant it for
