"""The repository's own bundle is the template's output: it must not drift."""

import runpy
from pathlib import Path

import pytest

from distributed_training.bundle.validate import validate_bundle

ROOT = Path(__file__).resolve().parents[2]


def test_root_bundle_matches_the_template(capsys):
    sync = runpy.run_path(str(ROOT / "scripts" / "sync_root_bundle.py"))
    assert sync["main"](["--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_root_bundle_validates(bundle_schema, target):
    findings = validate_bundle(ROOT, targets=[target], schema_path=bundle_schema)
    assert [str(finding) for finding in findings[target] if finding.is_error] == []
