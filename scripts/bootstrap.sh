#!/usr/bin/env bash
# Create .venv and install the project with everything its tests and local runs need. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
stamp=.venv/.installed-$(sha256sum pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first, pinned: a CPU build is enough here, and an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -e ".[dev]"
.venv/bin/python -m pip install --quiet --no-build-isolation deepspeed==0.19.8
rm -f .venv/.installed-*
touch "$stamp"
