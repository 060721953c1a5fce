"""Check the answers against the platform's rules before a single file is written.

The same checks already ran while cookiecutter rendered the project folder's name (local_extensions.py), before
the folder existed, and refused any error there: here they print the warnings, and stand guard for a caller that
renders without the extension."""

import json
import sys

sys.path.insert(0, {{ shared_source | tojson }})

from distributed_training.tooling.answers import check_answers  # noqa: E402

findings = check_answers(json.loads({{ cookiecutter | jsonify | tojson }}))
for finding in findings:
    print(finding, file=sys.stderr)
if any(finding.is_error for finding in findings):
    print("\nNothing was generated. Fix the answers above and run cookiecutter again.", file=sys.stderr)
    sys.exit(1)
