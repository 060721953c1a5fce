"""Rendering the template: a project of the test's own to edit, or one per set of answers to read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.rendering import render_template


@pytest.fixture
def render(tmp_path):
    """Render into this test's own folder (or `output_dir`); returns the project folder, the test's to edit."""

    def _render(output_dir: Path | None = None, **answers) -> Path:
        return render_template(output_dir or tmp_path, **answers)

    return _render


@pytest.fixture(scope="session")
def rendered(tmp_path_factory):
    """Render once per set of answers for the whole session; the project is shared, so read it, never edit it."""
    projects: dict[tuple, Path] = {}

    def _rendered(**answers) -> Path:
        key = tuple(sorted((name, str(value)) for name, value in answers.items()))
        if key not in projects:
            projects[key] = render_template(tmp_path_factory.mktemp("rendered"), **answers)
        return projects[key]

    return _rendered


@pytest.fixture(scope="session")
def bundle_schema() -> Path | None:
    """The Databricks CLI's bundle JSON schema (`databricks bundle schema`), when DATABRICKS_BUNDLE_SCHEMA names it."""
    path = os.environ.get("DATABRICKS_BUNDLE_SCHEMA")
    return Path(path) if path else None
