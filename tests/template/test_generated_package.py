"""The generated package, src/<package>/: the runtime carried from this repository, the chosen task as task.py, the
launchers of the chosen engines only, and nothing used only while generating (the tooling stays here)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_training.compute.requirements import ENGINES
from distributed_training.tooling.bundle.wheel_tasks import read_pyproject

REPOSITORY = Path(__file__).resolve().parents[2]
SHARED = REPOSITORY / "src" / "distributed_training"
TASKS = ("fare_regression", "causal_lm", "fine_tune")
# The tooling's folder (validate, run, advise, the template's answers) and the built-in tasks (the chosen one is
# task.py). Never in a project (it gets the tooling from its `test` extra).
GENERATION_ONLY = ("tooling", "tasks")
MAX_LINES = 3_128  # 3,000; 37 for the optimizer's and schedule's options, 22 for the starting model's evaluation and
# checkpoints without frozen parameters, 22 for building the model on rank 0 alone, 2 for evaluating in micro-batches,
# 22 for FSDP2's shards made from rank 0's weights on a meta-device model, 13 for the task's optional save_pretrained
# and the folder written whole (issue 37 allows up to 3,400 for what every task gains), 10 for a resume whose MLflow
# run cannot be reopened


def package_of(project: Path) -> Path:
    return project / "src" / "my_training"


def files_of(package: Path) -> dict[str, bytes]:
    return {path.relative_to(package).as_posix(): path.read_bytes() for path in sorted(package.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts}


def module_name(package: Path, path: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, here: str, modules: set[str]) -> set[str]:
    """The package's modules that the file at `path` imports (absolute or relative, `from . import x` included);
    `here`: the package relative imports start from (its own name for an `__init__.py`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[:len(here.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target:  # importing a.b.c imports a.b and a too
                if target in modules:
                    found.add(target)
                target = target.rpartition(".")[0]
    return found


def entry_points(project: Path, chosen: tuple[str, ...]) -> set[str]:
    """What runs the package from outside it: `python -m` (__main__), the wheel's scripts (the jobs' tasks), what
    the notebooks import, the task (loaded by name: config.DEFAULT_TASK) and the chosen engines (loaded by name:
    `train --engine`)."""
    package = package_of(project)
    modules = {module_name(package, path) for path in package.rglob("*.py")}
    scripts = read_pyproject(project / "pyproject.toml")["project"]["scripts"]
    found = {"my_training.__main__", "my_training.task", *(f"my_training.engines.{engine}" for engine in chosen),
             *(target.split(":")[0] for target in scripts.values())}
    for notebook in (project / "notebooks").glob("*.py"):
        found |= imported_modules(notebook, "", modules)
    return found


def unreachable_modules(project: Path, chosen: tuple[str, ...]) -> list[str]:
    """The package's modules that no import chain from an entry point reaches: two dead modules that import each
    other are as dead as one that nothing imports."""
    package = package_of(project)
    paths = {module_name(package, path): path for path in package.rglob("*.py")}
    modules = set(paths)
    reached, waiting = set(), sorted(entry_points(project, chosen))
    while waiting:
        name = waiting.pop()
        if name in reached:
            continue
        reached.add(name)
        here = name if paths[name].name == "__init__.py" else name.rpartition(".")[0]
        waiting += imported_modules(paths[name], here, modules) - reached
    return sorted(modules - reached)


def test_projects_that_differ_only_in_task_differ_only_in_task_py(rendered):
    fare = files_of(package_of(rendered(task="fare_regression", engine="all")))
    for task in TASKS[1:]:
        other = files_of(package_of(rendered(task=task, engine="all")))
        assert set(fare) == set(other)
        assert [name for name in fare if fare[name] != other[name]] == ["task.py"], task


@pytest.mark.parametrize("task", TASKS)
def test_the_chosen_task_is_what_the_project_trains(rendered, task):
    package = package_of(rendered(task=task))
    assert (package / "task.py").read_bytes() == (SHARED / "tasks" / f"{task}.py").read_bytes()
    # ... and `train` loads it unless told otherwise (config.DEFAULT_TASK is <package>.task)
    assert 'DEFAULT_TASK = f"{PACKAGE}.task"' in (package / "config.py").read_text()


def test_the_runtime_is_carried_as_it_is_in_this_repository(rendered):
    """Every carried file is the repository's own, byte for byte: one source, fixed in one place."""
    package = package_of(rendered(engine="all"))
    for name, content in files_of(package).items():
        if name in ("__init__.py", "__main__.py", "task.py"):  # the template's own, and the task
            continue
        assert content == (SHARED / name).read_bytes(), name


def test_the_default_project_is_small_and_holds_nothing_used_only_while_generating(rendered):
    package = package_of(rendered())
    # lines of code as cloc counts them: neither blank nor a comment alone (docstrings count)
    lines = sum(1 for path in package.rglob("*.py") for line in path.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#"))
    assert lines <= MAX_LINES, f"src/my_training/ has {lines} lines of Python code, over {MAX_LINES}"
    assert [name for name in GENERATION_ONLY if (package / name).exists()] == []
    assert sorted(path.name for path in package.iterdir() if path.name != "__pycache__") == sorted([
        "__init__.py", "__main__.py", "task.py", "config.py", "files.py", "findings.py", "launch.py", "run_folder.py",
        "scoring.py", "task_interface.py", "compute", "data", "engines", "training"])


@pytest.mark.parametrize("answers", [{}, {"engine": "all"}, {"engine": "ray"}, {"task": "causal_lm"}],
                         ids=lambda answers: "-".join(answers.values()) or "default")
def test_every_module_of_the_package_is_reached_from_an_entry_point(rendered, answers):
    """No dead module: a static walk of the imports from the entry points reaches every one."""
    project = rendered(**answers)
    package = package_of(project)
    chosen = ENGINES if answers.get("engine") == "all" else (answers.get("engine", "torch_distributor"),)
    reachable_from = entry_points(project, chosen)
    assert {"my_training.launch", "my_training.scoring"} <= reachable_from  # the scripts train and score
    assert {path.stem for path in (project / "notebooks").glob("*.py")} == {f"train_{engine}" for engine in chosen}
    assert unreachable_modules(project, chosen) == []
    # the data files are read by some module
    sources = "".join(path.read_text() for path in package.rglob("*.py"))
    for data in package.rglob("*.yaml"):
        assert f'"{data.name}"' in sources, f"{data.relative_to(package)} is read by no module"


def test_two_dead_modules_that_import_each_other_are_found(rendered, tmp_path):
    """Each is imported by another module, so "imported by some module" passes them; no entry point reaches them."""
    project = tmp_path / "project"
    shutil.copytree(rendered(), project)
    package = package_of(project)
    (package / "training" / "dead_one.py").write_text("from . import dead_two\n")
    (package / "training" / "dead_two.py").write_text("from .dead_one import *  # noqa: F403\n")
    assert unreachable_modules(project, ("torch_distributor",)) == ["my_training.training.dead_one",
                                                                     "my_training.training.dead_two"]
    # and one that a reached module imports is reached, with what it imports
    launch = package / "launch.py"
    launch.write_text(launch.read_text() + "\nfrom .training import dead_one  # noqa: E402,F401\n")
    assert unreachable_modules(project, ("torch_distributor",)) == []


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_not_chosen_are_pruned(rendered, engine):
    package = package_of(rendered(engine=engine))
    engines = package / "engines"
    carried = {path.stem for path in engines.glob("*.py")}
    assert engine in carried
    assert carried & set(ENGINES) == {engine}
    assert ("least_squares" in carried) == (engine == "spark_ml_connect")  # Spark ML's own solver
    assert "torchrun" in carried  # the serverless GPU hand-off, shared by the torch engines
    assert ("distributor" in carried) == (engine in ("torch_distributor", "deepspeed"))  # the launcher both run
    deepspeed_parts = {path.stem for path in (package / "training").glob("deepspeed_*.py")}
    assert deepspeed_parts == ({"deepspeed_config", "deepspeed_strategy"} if engine == "deepspeed" else set())
    # and what it carries is whole: the engine's module imports with the project's own source alone
    imported = subprocess.run([sys.executable, "-c", f"import my_training.engines.{engine}"], capture_output=True,
                              text=True, cwd=package.parent)
    assert imported.returncode == 0, imported.stderr[-2000:]


def test_a_ray_project_carries_ray_alone(rendered):
    engines = package_of(rendered(engine="ray")) / "engines"
    assert (engines / "ray.py").is_file()
    for name in ("torch_distributor.py", "deepspeed.py", "distributor.py", "spark_ml_connect.py", "least_squares.py"):
        assert not (engines / name).exists(), name
