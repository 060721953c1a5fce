from __future__ import annotations

import os
from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "distributed-training"


@pytest.fixture
def render(tmp_path):
    """Render the template through cookiecutter's Python API; returns the project folder."""

    def _render(output_dir: Path | None = None, **answers) -> Path:
        answers = {key: str(value) for key, value in answers.items()}
        return Path(cookiecutter(str(TEMPLATE), no_input=True, extra_context=answers,
                                 output_dir=str(output_dir or tmp_path)))

    return _render


@pytest.fixture(scope="session")
def bundle_schema() -> Path | None:
    path = os.environ.get("DATABRICKS_BUNDLE_SCHEMA")
    return Path(path) if path else None
