"""The package's two wings: the runtime (everything but tooling/), which every generated project carries, and the
tooling (tooling/), which stays here. The runtime never imports the tooling: a project has none to import."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "distributed_training"
TOOLING = "tooling"
# `python -m distributed_training`: the tool's command line (a project's own __main__.py comes from the template)
ENTRY_POINT = "__main__.py"


def runtime_modules(package: Path) -> list[Path]:
    return sorted(path for path in package.rglob("*.py") if path.relative_to(package).parts[0] not in
                  (TOOLING, ENTRY_POINT) and "__pycache__" not in path.parts)


def tooling_imports(package: Path, path: Path) -> list[str]:
    """The imports of the module at `path` that reach into the tooling, absolute or relative, as written."""
    parts = path.relative_to(package).with_suffix("").parts
    here = [package.name, *parts[:-1]]  # the package a relative import in this module starts from
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [(alias.name, f"import {alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            module = [*base, *(node.module.split(".") if node.module else [])]
            statement = f"from {'.' * node.level}{node.module or ''} import "
            targets = [(".".join([*module, alias.name]), statement + alias.name) for alias in node.names]
        else:
            continue
        found += [f"line {node.lineno}: {written}" for target, written in targets
                  if target.split(".")[:2] == [package.name, TOOLING]]
    return found


def violations(package: Path) -> dict[str, list[str]]:
    return {path.relative_to(package).as_posix(): found for path in runtime_modules(package)
            if (found := tooling_imports(package, path))}


def test_the_runtime_never_imports_the_tooling():
    assert violations(PACKAGE) == {}


def test_a_runtime_module_that_imports_the_tooling_is_named_with_the_import(tmp_path):
    package = tmp_path / "distributed_training"
    (package / TOOLING / "bundle").mkdir(parents=True)
    (package / "training").mkdir()
    (package / "launch.py").write_text("from .tooling.bundle import validate\n")
    (package / "training" / "loop.py").write_text("from .. import tooling\nfrom ..config import Config\n")
    (package / "scoring.py").write_text("import json\nimport distributed_training.tooling.answers\n")
    (package / TOOLING / "cli.py").write_text("from .. import launch\n")  # the tooling may import the runtime
    assert violations(package) == {
        "launch.py": ["line 1: from .tooling.bundle import validate"],
        "scoring.py": ["line 2: import distributed_training.tooling.answers"],
        "training/loop.py": ["line 1: from .. import tooling"],
    }
