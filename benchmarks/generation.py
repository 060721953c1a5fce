"""Generation and validation time: one project with the default answers, and the full answer matrix
(every cloud x engine x single/multi node), each rendered with cookiecutter and checked with `validate`.

And `validate` on a large bundle: 50,000 jobs of one notebook task each (2,000 with --quick), a file each, against
the floor of any validation, PyYAML's libyaml loader reading the same files (the ratio: how many times that floor).

With DATABRICKS_BUNDLE_SCHEMA set (or the shared schema beside the repository), validation includes the JSON schema.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

from .measure import Row, alternate, seconds

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "templates" / "distributed-training"
SHARED_SCHEMA = ROOT.parent / "shared" / "bundle-schema" / "jsonschema.json"
CLOUDS = ("azure", "aws", "gcp")


def schema_path() -> str | None:
    if os.environ.get("DATABRICKS_BUNDLE_SCHEMA"):
        return os.environ["DATABRICKS_BUNDLE_SCHEMA"]
    return str(SHARED_SCHEMA) if SHARED_SCHEMA.is_file() else None


def run(work_dir: str, quick: bool) -> list[Row]:
    from distributed_training.config import ENGINES

    schema = schema_path()
    with_schema = "with the JSON schema" if schema else "without the JSON schema (none found)"
    render, validate = _render_and_validate({}, work_dir, schema)
    rows = [
        Row("generation", "render one project (default answers)", "s", (render,), note="cookiecutter, hooks included"),
        Row("generation", "validate one project (dev and prod)", "s", (validate,), note=with_schema),
    ]
    matrix = list(itertools.product(CLOUDS, (*ENGINES, "all"), ("0", "2")))
    if quick:
        matrix = matrix[:2]
    total_render = total_validate = 0.0
    for cloud, engine, num_workers in matrix:
        render, validate = _render_and_validate(
            {"cloud": cloud, "engine": engine, "num_workers": num_workers}, work_dir, schema)
        total_render, total_validate = total_render + render, total_validate + validate
    rows += [
        Row("generation", f"render the answer matrix ({len(matrix)} projects)", "s", (total_render,),
            note="clouds x engines (and all) x 0/2 workers"),
        Row("generation", f"validate the answer matrix ({len(matrix)} projects)", "s", (total_validate,),
            note=with_schema),
    ]
    return rows + _large_bundle(Path(work_dir, "large-bundle"), 2_000 if quick else 50_000, repetitions=3)


def _large_bundle(folder: Path, jobs: int, repetitions: int) -> list[Row]:
    import yaml

    from distributed_training.tooling.bundle.validate import validate_bundle

    _notebook_jobs(folder, jobs)
    files = [folder / "databricks.yml", *sorted((folder / "resources").iterdir())]
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    def validate() -> float:
        elapsed, report = seconds(lambda: validate_bundle(folder))
        if any(report.values()):
            raise RuntimeError(f"the large bundle has findings: {report}")
        return elapsed

    def parse() -> float:
        return seconds(lambda: [yaml.load(file.read_text(), Loader=loader) for file in files])[0]

    measured = alternate({"validate": validate, "parse": parse}, repetitions, warm_up=True)  # the files cached
    return [Row("generation", f"validate {jobs:,} one-notebook jobs (dev and prod)", "s", tuple(measured["validate"]),
                tuple(measured["parse"]), "baseline: libyaml's safe_load of the same files; no schema",
                {"files": len(files), "yaml_bytes": sum(file.stat().st_size for file in files)})]


def _notebook_jobs(folder: Path, jobs: int) -> None:
    """A bundle of `jobs` jobs, a file each, each of one notebook task on an existing cluster (1,000 notebooks)."""
    (folder / "resources").mkdir(parents=True)
    (folder / "notebooks").mkdir()
    for number in range(min(jobs, 1000)):
        (folder / "notebooks" / f"nb_{number}.py").write_text("# Databricks notebook source\nprint(1)\n")
    (folder / "databricks.yml").write_text("bundle: {name: many}\ninclude: [resources/*.yml]\ntargets: {dev: {default: "
                                           "true}, prod: {mode: production, workspace: {root_path: /Workspace/Shared/"
                                           "many}}}\n")
    for number in range(jobs):
        (folder / "resources" / f"job_{number}.job.yml").write_text(
            f"resources:\n  jobs:\n    job_{number}:\n      name: job {number}\n      tasks:\n"
            f"        - task_key: t\n          existing_cluster_id: abc\n          notebook_task:\n"
            f"            notebook_path: ../notebooks/nb_{number % 1000}.py\n")


def _render_and_validate(answers: dict, work_dir: str, schema: str | None) -> tuple[float, float]:
    from cookiecutter.main import cookiecutter

    from distributed_training.tooling.bundle.validate import validate_bundle

    output_dir = tempfile.mkdtemp(dir=work_dir, prefix="generated-")
    render, project = seconds(lambda: cookiecutter(str(TEMPLATE), no_input=True, extra_context=answers,
                                                  output_dir=output_dir))
    validate, report = seconds(lambda: validate_bundle(project, schema_path=schema))
    errors = [str(finding) for findings in report.values() for finding in findings if finding.is_error]
    if errors:
        raise RuntimeError(f"the generated project {answers} does not validate: {errors[:3]}")
    return render, validate
