"""A generated project never installs databricks-connect and pyspark together (Databricks Connect replaces it)."""

from __future__ import annotations

import itertools
import re
import tomllib

import pytest


def requirement_names(pyproject: dict, selection: tuple[str, ...]) -> set[str]:
    """Distribution names installed for the project itself plus the chosen extras/groups, self-references followed."""
    project = pyproject["project"]
    extras = project.get("optional-dependencies", {})
    groups = pyproject.get("dependency-groups", {})
    names: set[str] = set()
    pending = [("dependencies", None)] + [(("extra" if item in extras else "group"), item) for item in selection]
    seen = set()
    while pending:
        kind, item = pending.pop()
        if (kind, item) in seen:
            continue
        seen.add((kind, item))
        requirements = project["dependencies"] if kind == "dependencies" else (extras if kind == "extra" else groups)[item]
        for requirement in requirements:
            name = re.match(r"[A-Za-z0-9_.-]+", requirement).group().lower().replace("_", "-")
            chosen = re.search(r"\[([^\]]+)\]", requirement)
            if name == project["name"] and chosen:
                pending += [("extra", extra.strip()) for extra in chosen.group(1).split(",")]
            else:
                names.add(name)
    return names


@pytest.mark.parametrize("spark_version, connect", [("17.3.x-gpu-ml-scala2.13", "17.3.*"),
                                                    ("16.4.x-gpu-ml-scala2.12", "16.4.*")])
def test_no_install_combination_puts_databricks_connect_beside_pyspark(render, spark_version, connect):
    project = render(spark_version=spark_version)
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
