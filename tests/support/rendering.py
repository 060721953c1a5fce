"""Rendering the template through cookiecutter's Python API, as `cookiecutter --no-input` does."""

from __future__ import annotations

from pathlib import Path

from cookiecutter.main import cookiecutter

REPOSITORY = Path(__file__).resolve().parents[2]
TEMPLATE = REPOSITORY / "templates" / "distributed-training"


def render_template(output_dir: Path, **answers) -> Path:
    """The project folder cookiecutter writes for these answers (every other answer at its default)."""
    answers = {key: str(value) for key, value in answers.items()}
    return Path(cookiecutter(str(TEMPLATE), no_input=True, extra_context=answers, output_dir=str(output_dir)))
