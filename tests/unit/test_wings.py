"""The package's two wings: the runtime (everything but tooling/), which every generated project carries, and the
tooling (tooling/), which stays here. The runtime never imports the tooling: a project has none to import. And the
runtime's layers, as ARCHITECTURE.md draws them: no module imports from a layer above its own."""

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


def imports_of(package: Path, path: Path) -> list[tuple[str, str]]:
    """What the module at `path` imports, absolute or relative: (the dotted name, the import as written)."""
    parts = path.relative_to(package).with_suffix("").parts
    here = [package.name, *parts[:-1]]  # the package a relative import in this module starts from
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, f"line {node.lineno}: import {alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            module = [*base, *(node.module.split(".") if node.module else [])]
            statement = f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import "
            found += [(".".join([*module, alias.name]), statement + alias.name) for alias in node.names]
    return found


def tooling_imports(package: Path, path: Path) -> list[str]:
    """The imports of the module at `path` that reach into the tooling, as written."""
    return [written for target, written in imports_of(package, path)
            if target.split(".")[:2] == [package.name, TOOLING]]


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


# The runtime's layers, from the bottom up (ARCHITECTURE.md): a module's layer is its longest prefix here.
LAYERS = (
    ("files", "findings", "run_folder", "task_interface", "tasks", "task", "training.ranks", "data", "data.staged",
     "compute", "compute.catalog", "compute.requirements", "compute.runtime"),
    ("compute.guards", "compute.preflight", "config"),
    ("training",),
    ("data.staging",),
    ("engines",),
    ("launch", "scoring"),
)


def layer_of(name: str) -> int | None:
    """The layer of a dotted name inside the package (without the package's name), None for one outside it."""
    prefixes = [(len(prefix), number) for number, layer in enumerate(LAYERS) for prefix in layer
                if name == prefix or name.startswith(f"{prefix}.")]
    return max(prefixes)[1] if prefixes else None


def layered_modules(package: Path) -> dict[str, Path]:
    """The runtime's modules by dotted name (a package's by its own), but the package's __init__.py: a project's
    comes from the template."""
    names = {".".join(path.relative_to(package).with_suffix("").parts): path for path in runtime_modules(package)}
    return {name.removesuffix(".__init__"): path for name, path in names.items() if name != "__init__"}


def upward_imports(package: Path) -> list[str]:
    found = []
    for name, path in layered_modules(package).items():
        for target, written in imports_of(package, path):
            inside = target.split(".")[1:] if target.split(".")[0] == package.name else None
            above = layer_of(".".join(inside)) if inside else None
            if above is not None and above > layer_of(name):
                found.append(f"{name} ({written}) imports from layer {above} above its own, {layer_of(name)}")
    return found


def test_every_runtime_module_has_a_layer():
    assert [name for name in layered_modules(PACKAGE) if layer_of(name) is None] == []


def test_no_runtime_module_imports_from_a_layer_above_its_own():
    assert upward_imports(PACKAGE) == []


def test_an_import_from_a_higher_layer_is_named(tmp_path):
    package = tmp_path / "distributed_training"
    (package / "training").mkdir(parents=True)
    (package / "training" / "loop.py").write_text("from ..launch import main\nfrom . import ranks\n")
    (package / "config.py").write_text("from .task_interface import load_task\n")  # downward: allowed
    assert upward_imports(package) == [
        "training.loop (line 1: from ..launch import main) imports from layer 5 above its own, 2"]
