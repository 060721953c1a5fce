"""The jobs' `train` arguments against the project's own `train`: an option it does not take fails the run on the
cluster ("unrecognized arguments"), after deploy and cluster start, though the bundle itself is valid.

Which options `train` takes depends on the project's task.py (each field of its `Options` is an option), so they are
read from the project itself: its package's `config.parser_for`, in a fresh Python with the project's `src/` on the
path and torch kept out (a task's module must import without torch: the serverless stage task has none), which is
also quick. Only wheel tasks that call the project's own `train` (the entry point that names `<package>.launch`) are
checked, and only bundles whose package has that `config` module: a generated project.

A job that fine-tunes passes the pretrained model from a bundle variable (--base-model ${var.base_model}, empty until
the user sets it): an empty one is named before the run stops on it. Replacing task.py with a task that takes no such
option leaves it behind in the jobs: that is named with the variable to remove too.

Each job run trains in its own folder only when its `--output-dir` holds the job run id (`{{job.run_id}}`, directly or
through a job parameter's default): the project's run folder (run_folder.py) resumes a failed run found there and
reports a finished one's metrics instead of training, so without it every run after the first trains nothing.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path as FilePath

from ...findings import Finding
from .jobs_and_clusters import Jobs
from .paths import format_path
from .wheel_tasks import read_pyproject

TRAIN_FUNCTION = "launch:train_main"
READ_OPTIONS = """
import json, sys
for blocked in ("torch", "deepspeed"):
    sys.modules[blocked] = None  # imports of it fail, as on the serverless stage task
sys.path.insert(0, "src")
package = sys.argv[1]
config = __import__(package + ".config", fromlist=["parser_for"])
engines = __import__(package + ".engines", fromlist=["available"]).available()
parser = config.parser_for(config.DEFAULT_TASK, engines)
print(json.dumps({"options": sorted(parser._option_string_actions), "engines": list(engines)}))
"""
READ_SECONDS = 60
JOB_RUN_ID = re.compile(r"\{\{\s*job\.run_id\s*\}\}")  # the Jobs dynamic value reference to the job run's id
JOB_PARAMETER = re.compile(r"\{\{\s*job\.parameters\.([^\s}]+)\s*\}\}")
# The train options the template fills from a bundle variable (the fine_tune task's): option -> variable.
VARIABLE_OPTIONS = {"--base-model": "base_model"}


def train_argument_findings(bundle_root: FilePath, jobs: Jobs, target: str = "dev") -> list[Finding]:
    entry_points = _train_entry_points(bundle_root)
    calls = [(job_key, job, path, task["python_wheel_task"])
             for job_key, job, tasks in jobs for path, task in tasks
             if isinstance(task.get("python_wheel_task"), dict)
             and isinstance(task["python_wheel_task"].get("entry_point"), str)
             and task["python_wheel_task"]["entry_point"] in entry_points]
    findings = []
    for job_key, job, path, wheel_task in calls:
        package = entry_points[wheel_task["entry_point"]]
        accepted = _accepted(bundle_root, package)
        where = format_path((*path, "python_wheel_task", "parameters"))
        if isinstance(accepted, str):
            return [Finding("train-options-unreadable", f"the jobs' train arguments were not checked: {accepted}",
                            f"fix the error above (python -m {package} train --help shows it too)", path=where,
                            severity="warning")]
        findings += _argument_findings(job_key, package, wheel_task.get("parameters"), accepted, where, target)
        findings += _shared_output_dir(job_key, job, wheel_task.get("parameters"), where)
    return findings


def _shared_output_dir(job_key: str, job: dict, parameters, where: str) -> list[Finding]:
    """A warning where the job's --output-dir holds no job run id: every run of the job would share one folder."""
    if not isinstance(parameters, list):
        return []
    defaults = {str(parameter.get("name")): str(parameter.get("default", ""))
                for parameter in job.get("parameters") or [] if isinstance(parameter, dict)}
    for index, parameter in enumerate(parameters):
        if parameter == "--output-dir" and index + 1 < len(parameters):
            index, value = index + 1, str(parameters[index + 1])
        elif isinstance(parameter, str) and parameter.startswith("--output-dir="):
            value = parameter.split("=", 1)[1]
        else:
            continue
        through_parameters = " ".join(defaults.get(name, "") for name in JOB_PARAMETER.findall(value))
        if JOB_RUN_ID.search(value) or JOB_RUN_ID.search(through_parameters):
            return []
        return [Finding(
            "output-dir-shared-by-runs", f"job {job_key} trains every run in --output-dir {value}, which holds no job "
            "run id: the second run finds the first one's folder, and resumes it, or reports its metrics and trains "
            "nothing if it finished", "end it with the job run id: append /{{job.run_id}} to its value (each run its "
            "own folder; a retry or repair resumes there)", path=f"{where}[{index}]", severity="warning")]
    return []


def _argument_findings(job_key: str, package: str, parameters, accepted: dict, where: str,
                       target: str) -> list[Finding]:
    if not isinstance(parameters, list):
        return []
    findings = []
    options, engines = set(accepted["options"]), accepted["engines"]
    for index, parameter in enumerate(parameters):
        if not isinstance(parameter, str) or not parameter.startswith("--"):
            continue
        name, joined, value = parameter.partition("=")
        if not joined and index + 1 < len(parameters) and not str(parameters[index + 1]).startswith("--"):
            value = str(parameters[index + 1])
        if name not in options and name in VARIABLE_OPTIONS:
            findings.append(Finding(
                "unknown-train-option",
                f"job {job_key} passes {name} to train, which this project's train does not take (its task.py has "
                "no such option: the fine_tune task's, left behind)",
                f"remove {parameter!r} and its value from the job's parameters, and the bundle variable "
                f"{VARIABLE_OPTIONS[name]} from databricks.yml; `python -m {package} train --help` lists the options",
                path=f"{where}[{index}]"))
        elif name not in options:
            findings.append(Finding(
                "unknown-train-option",
                f"job {job_key} passes {name} to train, which this project's train does not take (its task.py has "
                "no such option)",
                f"remove {parameter!r} from the job's parameters; to train with another value of the task's own, "
                f"change its default in task.py's Options (the jobs train task.py's defaults); `python -m {package} "
                "train --help` lists the options", path=f"{where}[{index}]"))
        elif name in VARIABLE_OPTIONS and not value.strip():
            variable = VARIABLE_OPTIONS[name]
            findings.append(Finding(
                "empty-base-model",
                f"job {job_key} trains with an empty {name} (the bundle variable {variable} is empty in target "
                f"{target}): the run stops before training, after the cluster started",
                f"set {variable} to the pretrained model's folder in Hugging Face format: in databricks.yml, "
                f"targets.{target}.variables.{variable}: /Volumes/<catalog>/<schema>/<volume>/<model>, or deploy "
                f"with --var {variable}=<folder>", path=f"{where}[{index}]", severity="warning"))
        elif name == "--engine" and index + 1 < len(parameters) and parameters[index + 1] not in engines:
            findings.append(Finding(
                "unknown-train-engine", f"job {job_key} trains with --engine {parameters[index + 1]}, which this "
                f"project does not carry (it has {', '.join(engines)})",
                f"use one of {', '.join(engines)}, or generate the project with that engine",
                path=f"{where}[{index + 1}]"))
    return findings


def _train_entry_points(bundle_root: FilePath) -> dict[str, str]:
    """Entry point name -> package, for the project's entry points that are its `train`."""
    pyproject_path = bundle_root / "pyproject.toml"
    pyproject = read_pyproject(pyproject_path) if pyproject_path.is_file() else None
    if not isinstance(pyproject, dict):
        return {}
    found = {}
    for name, target in pyproject.get("project", {}).get("scripts", {}).items():
        package, _, function = str(target).partition(".")
        if function == TRAIN_FUNCTION and (bundle_root / "src" / package / "config.py").is_file():
            found[name] = package
    return found


def _accepted(bundle_root: FilePath, package: str) -> dict | str:
    """The options and engines of the project's train, or why they could not be read."""
    sources = sorted((bundle_root / "src" / package).rglob("*.py"))
    return _read_accepted(str(bundle_root), package, tuple(path.stat().st_mtime_ns for path in sources))


@functools.lru_cache(maxsize=16)
def _read_accepted(bundle_root: str, package: str, _sources_changed: tuple) -> dict | str:
    try:
        completed = subprocess.run([sys.executable, "-c", READ_OPTIONS, package], cwd=bundle_root,
                                   capture_output=True, text=True, timeout=READ_SECONDS)
    except subprocess.TimeoutExpired:
        return f"reading the options of src/{package} took more than {READ_SECONDS} s"
    if completed.returncode != 0:
        last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        last = last.split("TaskError: ", 1)[-1]  # the task's own one-line reason (file, line, cause) reads alone
        return f"src/{package} does not import without torch ({last})"
    return json.loads(completed.stdout)
