"""Generation and validation time: one project with the default answers, and the full answer matrix
(every cloud x engine x single/multi node), each rendered with cookiecutter and checked with `validate`.

With DATABRICKS_BUNDLE_SCHEMA set (or the shared schema beside the repository), validation includes the JSON schema.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

from .measure import Row, seconds

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
    return rows


def _render_and_validate(answers: dict, work_dir: str, schema: str | None) -> tuple[float, float]:
    from cookiecutter.main import cookiecutter

    from distributed_training.bundle.validate import validate_bundle

    output_dir = tempfile.mkdtemp(dir=work_dir, prefix="generated-")
    render, project = seconds(lambda: cookiecutter(str(TEMPLATE), no_input=True, extra_context=answers,
                                                  output_dir=output_dir))
    validate, report = seconds(lambda: validate_bundle(project, schema_path=schema))
    errors = [str(finding) for findings in report.values() for finding in findings if finding.is_error]
    if errors:
        raise RuntimeError(f"the generated project {answers} does not validate: {errors[:3]}")
    return render, validate
