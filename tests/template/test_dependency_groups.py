"""A generated project's dependencies: nothing heavy on the cluster, the tooling only in the `test` extra, and
databricks-connect never beside pyspark (Databricks Connect replaces it)."""

from __future__ import annotations

import importlib.util
import itertools
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPOSITORY = Path(__file__).resolve().parents[2]
TOOL = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
HEAVY = {"pyspark", "torch", "deepspeed", "ray", "mlflow", "mlflow-skinny", "databricks-connect"}


def name_of(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group().lower().replace("_", "-")


def extras_of(requirement: str) -> list[str]:
    chosen = re.match(r"[A-Za-z0-9_.-]+\s*\[([^\]]+)\]", requirement)
    return [extra.strip() for extra in chosen.group(1).split(",")] if chosen else []


def requirement_names(pyproject: dict, selection: tuple[str, ...]) -> set[str]:
    """Distribution names installed for the project itself plus the chosen extras/groups, self-references and the
    tool's own extras (from this repository's pyproject.toml) followed."""
    documents = {name_of(pyproject["project"]["name"]): pyproject, name_of(TOOL["project"]["name"]): TOOL}
    project = pyproject["project"]
    pending = [(name_of(project["name"]), "", None)] + [
        (name_of(project["name"]), "extra" if item in project.get("optional-dependencies", {}) else "group", item)
        for item in selection]
    names, seen = set(), set()
    while pending:
        owner, kind, item = pending.pop()
        if (owner, kind, item) in seen:
            continue
        seen.add((owner, kind, item))
        document = documents[owner]
        requirements = (document["project"]["dependencies"] if not kind else
                        document["project"]["optional-dependencies"][item] if kind == "extra" else
                        document["dependency-groups"][item])
        for requirement in requirements:
            name = name_of(requirement)
            if name in documents:
                pending += [(name, "", None), *((name, "extra", extra) for extra in extras_of(requirement))]
                if name != owner:
                    names.add(name)
            else:
                names.add(name)
    return names


def test_the_cluster_gets_no_heavy_package_and_the_tool_comes_with_the_test_extra(rendered):
    project = rendered(engine="all")
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert not requirement_names(pyproject, ()) & HEAVY  # the wheel a job installs: the runtime has them
    [tool] = [requirement for requirement in pyproject["project"]["optional-dependencies"]["test"]
              if name_of(requirement) == "distributed-training"]
    # never a path of the machine that generated it, nor a file URL: from this checkout (no remote), the tool's wheel
    # in the project's wheels/, by a version with a local label
    assert "file:" not in tool and str(REPOSITORY) not in tool
    [wheel] = (project / "wheels").glob("*.whl")
    version = wheel.name.split("-")[1]
    assert tool == f"distributed-training[validate,remote]=={version}"
    assert re.fullmatch(rf"{re.escape(TOOL['project']['version'])}\+local[0-9a-f]{{12}}", version)
    assert {"validate", "remote"} <= set(TOOL["project"]["optional-dependencies"])
    test = requirement_names(pyproject, ("test",))
    assert {"distributed-training", "jsonschema", "databricks-sdk", "pytest", "pyspark", "torch"} <= test
    assert "distributed-training" not in requirement_names(pyproject, ("local",))
    assert "cookiecutter" not in test  # generating is not what a project's tests do


@pytest.mark.parametrize("answers, engines", [({}, {"torch_distributor"}), ({"engine": "all"}, {"ray", "spark_ml"}),
                                              ({"engine": "ray"}, {"ray"}),
                                              ({"engine": "spark_ml_connect"}, {"spark_ml"})],
                         ids=lambda value: "-".join(value.values()) if isinstance(value, dict) else None)
def test_the_local_extra_has_what_the_chosen_engines_need(rendered, answers, engines):
    pyproject = tomllib.loads((rendered(**answers) / "pyproject.toml").read_text())
    local = requirement_names(pyproject, ("local",))
    assert {"pyspark", "torch", "mlflow-skinny", "pandas", "scipy"} <= local  # scipy: MLflow's signature inference
    assert ("ray" in local) == ("ray" in engines)
    assert ("torcheval" in local) == ("spark_ml" in engines)


@pytest.mark.parametrize("answers, connect", [({}, "17.3.*"), ({"spark_version": "16.4.x-scala2.12"}, "16.4.*"),
                                              ({"compute": "serverless_gpu"}, "17.3.*")],
                         ids=["default", "16.4", "serverless"])
def test_no_install_combination_puts_databricks_connect_beside_pyspark(rendered, answers, connect):
    project = rendered(**answers)
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["dependency-groups"]["connect"] == [f"databricks-connect=={connect}"]
    choices = [*pyproject["project"]["optional-dependencies"], *pyproject["dependency-groups"]]
    with_pyspark = set()
    for size in (1, 2):
        for selection in itertools.combinations(choices, size):
            names = requirement_names(pyproject, selection)
            if "pyspark" in names:
                with_pyspark.add(selection)
            if "databricks-connect" in names and size == 1:
                assert "pyspark" not in names, selection
    assert ("test",) in with_pyspark and ("local",) in with_pyspark
    assert not any("connect" in selection for selection in with_pyspark if len(selection) == 1)
    # the tool a project tests with never brings either into the connect environment
    assert not {"pyspark", "databricks-connect"} & requirement_names(
        {"project": {"name": "probe", "dependencies": ["distributed-training[validate,remote]"]}}, ())


def load_extensions(repository: Path = REPOSITORY):
    spec = importlib.util.spec_from_file_location(
        "local_extensions", repository / "templates" / "distributed-training" / "local_extensions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(repository: Path, *arguments: str) -> str:
    return subprocess.run(["git", "-C", str(repository), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           *arguments], check=True, capture_output=True, text=True).stdout.strip()


def test_a_project_generated_from_a_git_url_pins_the_tool_to_the_commit_over_https_without_credentials(capsys):
    """cookiecutter takes gh:/gl:/bb: abbreviations and scp-style git@host:org/repo; pip takes neither after git+
    (PEP 508 wants a URL), and a CI runner has no ssh key: each is written as https. A user name or token in the URL
    (a GitLab CI clone's `https://gitlab-ci-token:<token>@host/...`) is never written."""
    extensions = load_extensions()
    commit = git(REPOSITORY, "rev-parse", "HEAD")
    expected = {
        "gh:example/dt": "git+https://github.com/example/dt",
        "gl:group/dt": "git+https://gitlab.com/group/dt",
        "bb:team/dt": "git+https://bitbucket.org/team/dt",
        "git@github.com:example/dt.git": "git+https://github.com/example/dt.git",
        "ssh://git@gitlab.example.com:2222/group/dt.git": "git+https://gitlab.example.com/group/dt.git",
        "git+https://example.com/dt.git": "git+https://example.com/dt.git",
        "https://example.com:8443/dt.git": "git+https://example.com:8443/dt.git",
        "https://gitlab-ci-token:glcbt-SECRET@gitlab.example.com/group/dt.git":
            "git+https://gitlab.example.com/group/dt.git",
        "https://oauth2:SECRET@example.com/dt.git": "git+https://example.com/dt.git",
    }
    for template, url in expected.items():
        requirement = Requirement(extensions.tool_requirement({"_template": template}))
        assert (requirement.name, requirement.extras) == ("distributed-training", {"validate", "remote"})
        assert requirement.url == f"{url}@{commit}", template
    warnings = capsys.readouterr().err
    assert "SECRET" not in warnings
    assert warnings.count("[tool-url-credentials]") == 2 and warnings.count("[tool-url-https]") == 2
    assert "pyproject.toml:project.optional-dependencies.test: warning [tool-url-https] the template's git URL " \
           "git@github.com:example/dt.git is written as https://github.com/example/dt.git" in warnings


def template_checkout(tmp_path: Path) -> Path:
    """A checkout of the template: its extensions, the tool's source and metadata, a commit, no remote."""
    clone = tmp_path / "template"
    (clone / "templates" / "distributed-training").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "templates/distributed-training/local_extensions.py"):
        shutil.copy(REPOSITORY / name, clone / name)
    (clone / "src").symlink_to(REPOSITORY / "src")
    git(clone, "init", "--quiet")
    git(clone, "add", ".")
    git(clone, "commit", "--quiet", "-m", "template")
    return clone


def test_a_checkout_without_a_remote_gives_the_tool_as_a_wheel_in_the_project_and_a_remote_one_by_git(tmp_path,
                                                                                                     capsys):
    """No path of the generating machine: the tool's wheel, built into the project's wheels/ under a version with a
    local label (the README says why no index can serve it); the checkout's origin instead, when it is a remote one,
    with a warning while its commit is on no remote branch (`git branch -r --contains`): pip could not fetch it."""
    clone = template_checkout(tmp_path)
    extensions = load_extensions(clone)
    answers = {"_template": str(clone / "templates" / "distributed-training"), "_output_dir": str(tmp_path),
               "project_slug": "my-training"}
    (tmp_path / "my-training").mkdir()
    requirement = Requirement(extensions.tool_requirement(answers))
    [pin] = requirement.specifier
    assert (requirement.url, pin.operator) == (None, "==")
    assert pin.version.startswith(f"{TOOL['project']['version']}+local")
    assert [path.name for path in (tmp_path / "my-training" / "wheels").iterdir()] == [
        f"distributed_training-{pin.version}-py3-none-any.whl"]

    git(clone, "remote", "add", "origin", "git@gitlab.com:team/dt.git")
    pushed = git(clone, "rev-parse", "HEAD")
    git(clone, "update-ref", "refs/remotes/origin/main", pushed)  # what a push leaves behind
    capsys.readouterr()
    assert Requirement(extensions.tool_requirement(answers)).url == f"git+https://gitlab.com/team/dt.git@{pushed}"
    assert "tool-commit-not-pushed" not in capsys.readouterr().err
    git(clone, "commit", "--quiet", "--allow-empty", "-m", "not pushed")
    unpushed = git(clone, "rev-parse", "HEAD")
    assert Requirement(extensions.tool_requirement(answers)).url == f"git+https://gitlab.com/team/dt.git@{unpushed}"
    assert f"[tool-commit-not-pushed] the template's commit {unpushed[:12]} is on no remote branch" in \
        capsys.readouterr().err

    git(clone, "remote", "set-url", "origin", str(REPOSITORY))  # a local origin: not a remote one
    assert "==" in extensions.tool_requirement(answers)
