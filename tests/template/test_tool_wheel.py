"""A project generated from a checkout with no remote takes the tool from the wheel built into its `wheels/` folder,
pinned by a version with a local label, which no index can serve in its place: PyPI refuses uploads with a local
version (pypi/warehouse `warehouse/forklift/metadata.py`, `_validate_metadata`), and `==` with a local label matches
that label only (PEP 440, "Version matching"). Its `test` extra installs with no index at all, and the tool that then
runs is that wheel; a package of the tool's name from elsewhere (dependency confusion) is never taken.

Why not a relative `file:` reference in the extra: the project's own wheel, which every job installs, carries its
extras' requirements, and pip before 24.1 (the 23.2.1 that Python 3.11's ensurepip brings, tried here) refuses such a
line with "Invalid URL given" whatever extras are asked for; uv refuses one too ("relative path without a working
directory", uv 0.13).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

# The machine's pip configuration (an index, find-links, constraints) stays out: only what the command line says;
# and no PYTHONPATH, which would put a checkout's tool before the installed one.
PIP_ENVIRONMENT = {**{key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
                   "PIP_CONFIG_FILE": os.devnull}


def run(command, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], cwd=cwd, env=PIP_ENVIRONMENT, capture_output=True,
                          text=True, timeout=600)


def the_tool_requirement(project: Path) -> Requirement:
    test = tomllib.loads((project / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    [tool] = [Requirement(line) for line in test if line.startswith("distributed-training")]
    return tool


def impostor_wheel(folder: Path, version: str) -> Path:
    """A wheel of the tool's name from somewhere else: what a squatter on the name could publish."""
    folder.mkdir(exist_ok=True)
    wheel = folder / f"distributed_training-{version}-py3-none-any.whl"
    info = f"distributed_training-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("distributed_training/__init__.py", "raise SystemExit('the impostor ran')\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: distributed-training\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def test_a_local_label_matches_that_label_only():
    pinned = SpecifierSet("==0.1.0+local0a1b2c3d4e5f")
    assert [version for version in ("0.1.0", "0.1.0+local0a1b2c3d4e5f", "0.1.0+other", "99.0")
            if pinned.contains(version)] == ["0.1.0+local0a1b2c3d4e5f"]


def test_the_test_extra_installs_the_tool_from_the_projects_wheels_with_no_index(render, tmp_path):
    project = render()
    tool = the_tool_requirement(project)
    [pin] = tool.specifier
    [wheel] = (project / "wheels").iterdir()
    assert wheel.name == f"distributed_training-{pin.version}-py3-none-any.whl"

    # A venv that sees this one's packages (pyspark, torch, the tool's own dependencies) through a .pth file, so that
    # pip, with no index, has only the project and the tool to install; a .pth in a folder added that way is not
    # read, so this checkout's editable tool stays out of it.
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path).returncode == 0
    python = venv / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    tmp_path).stdout.strip())
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--no-build-isolation"]

    squatted = impostor_wheel(tmp_path / "elsewhere", "99.0")
    impostor_wheel(tmp_path / "elsewhere", Version(pin.version).public)  # the same version without the label
    refused = run([*pip, "--find-links", squatted.parent, "-e", ".[test]"], project)
    assert refused.returncode != 0 and f"No matching distribution found for distributed-training=={pin.version}" in \
        refused.stderr, refused.stderr[-2000:]

    installed = run([*pip, "--find-links", "wheels", "--find-links", squatted.parent, "-e", ".[test]"], project)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    where = run([python, "-c", "import importlib.metadata, distributed_training; "
                 "print(importlib.metadata.version('distributed-training')); print(distributed_training.__file__)"],
                project.parent).stdout.split()
    assert where == [pin.version, str(site / "distributed_training" / "__init__.py")]
    validated = run([python, "-m", "distributed_training", "validate", "."], project)  # CI's step, by that wheel
    assert validated.returncode == 0 and "\n0 errors" in validated.stdout, validated.stdout + validated.stderr
