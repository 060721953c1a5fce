"""The bundle validates: typed resources, references, compute guards, and the JSON schema when one is given.

Set DATABRICKS_BUNDLE_SCHEMA to the output of `databricks bundle schema` to include the schema check.
"""

from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.bundle.validate import validate_bundle

BUNDLE_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_bundle_validates(target):
    findings = validate_bundle(BUNDLE_ROOT, targets=[target])
    errors = [str(finding) for target_findings in findings.values() for finding in target_findings if finding.is_error]
    assert errors == []
