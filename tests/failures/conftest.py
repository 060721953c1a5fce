"""Fixtures of the failure matrix: rendering the template into an empty folder that must stay empty."""

from __future__ import annotations

from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "distributed-training"


class Generation:
    """Renders the template without prompts into `output_dir`, two levels below the test's own folder, so that a
    slug which climbs out of it ("../x") is caught leaving something there too."""

    def __init__(self, root: Path):
        self.root = root
        self.output_dir = root / "work" / "out"
        self.output_dir.mkdir(parents=True)

    def render(self, **answers) -> str:
        from cookiecutter.main import cookiecutter

        return cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(self.output_dir),
                            extra_context={key: str(value) for key, value in answers.items()})

    def left_behind(self) -> list[str]:
        """Every path under the test's folder besides the output folder and its parent."""
        return sorted(str(path.relative_to(self.root)) for path in self.root.rglob("*")
                      if path not in (self.output_dir, self.output_dir.parent))


@pytest.fixture
def generation(tmp_path) -> Generation:
    return Generation(tmp_path)


@pytest.fixture
def run_on_the_shared_session(spark, monkeypatch):
    """`--local` runs on the test session's Spark, which the run leaves running; a run that got as far as starting
    training processes fails the test."""
    from distributed_training import launch
    from distributed_training.engines import distributor

    def started(*_args, **_kwargs):
        pytest.fail("the run went on to start its training processes: it must fail before them", pytrace=False)

    monkeypatch.setattr(launch, "_local_session", lambda engine, config: spark)
    monkeypatch.setattr(spark, "stop", lambda: None)
    monkeypatch.setattr(distributor.TorchDistributorEngine, "distributor", started)
