"""Jinja extension for the template: the tool's answer logic, available while rendering, and the answer checks.

Cookiecutter puts this folder on sys.path for `_extensions`; the tool lives two folders up, in the repository's
`src/` (the template is always used from a checkout or a clone of the whole repository).

The answers are checked while cookiecutter renders the project folder's name, which it does before it creates
anything: a refusal leaves nothing behind (a pre_gen_project hook runs only once the folder, and its parents for a
`project_slug` with a '/', exist). The refusal is cookiecutter's own FailedHookException, which its command line
prints as a message, not a traceback.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from jinja2.ext import Extension

REPOSITORY = Path(__file__).resolve().parents[2]
SHARED_SOURCE = REPOSITORY / "src"
if str(SHARED_SOURCE) not in sys.path:
    sys.path.insert(0, str(SHARED_SOURCE))

from distributed_training import answers, clusters, serverless  # noqa: E402  (needs the path above)
from distributed_training.compute.runtime import versions  # noqa: E402

TOOL = "distributed-training[validate,remote]"
PROJECT_FOLDER = "{{cookiecutter.project_slug}}"  # the template's folder: its name is rendered before anything is written
# A template or origin URL of a repository elsewhere: a URL (not file://), git@host:..., or cookiecutter's abbreviations.
REMOTE = re.compile(r"^(git\+)?((?!file:)\w+://|[\w.-]+@[\w.-]+:|gh:|gl:|bb:)")
ABBREVIATIONS = {"gh:": "https://github.com/", "gl:": "https://gitlab.com/", "bb:": "https://bitbucket.org/"}


def refuse_bad_answers(cookiecutter) -> str:
    """Nothing, or a refusal of the answers (each with its rule and fix) before a single file or folder exists."""
    from cookiecutter.exceptions import FailedHookException

    findings = answers.check_answers(dict(cookiecutter))
    errors = [finding for finding in findings if finding.is_error]
    if not errors:
        return ""  # warnings are printed by the pre_gen_project hook, once
    for finding in findings:
        print(finding, file=sys.stderr)
    message = (f"Nothing was generated: {len(errors)} answer(s) refused above. Fix them and run cookiecutter again.")
    print(f"\n{message}", file=sys.stderr)
    raise FailedHookException(message)


def _to_yaml(value, indent: int = 0) -> str:
    """A mapping as block YAML, every line after the first indented by `indent` spaces."""
    text = yaml.safe_dump(value, sort_keys=False, default_flow_style=False).rstrip("\n")
    return text.replace("\n", "\n" + " " * indent)


def tool_requirement(template: str) -> str:
    """Where a generated project gets this repository's tooling (validate, advise, run) as a development dependency,
    as a requirement that installs anywhere: the commit of the git repository it was generated from (the template's
    URL, or the origin of the checkout it was generated from), else the tool by name and version, from a wheel or an
    index the user points pip at (the generated README says how). Never a path of the machine that generated it."""
    url = template if REMOTE.match(template) else _git("config", "--get", "remote.origin.url")
    commit = _git("rev-parse", "HEAD")
    if url and REMOTE.match(url) and commit:
        return f"{TOOL} @ git+{pip_git_url(url)}@{commit}"
    return f"{TOOL}=={tool_version()}"


def pip_git_url(url: str) -> str:
    """A git URL as pip takes it after `git+`: cookiecutter's gh:/gl:/bb: abbreviations spelled out, scp-style
    `git@host:org/repo` as `ssh://git@host/org/repo` (pip refuses the scp form)."""
    url = url.removeprefix("git+")
    for short, long in ABBREVIATIONS.items():
        if url.startswith(short):
            url = long + url[len(short):]
    scp = re.fullmatch(r"([\w.-]+@[\w.-]+):(?!//)(.+)", url)
    return f"ssh://{scp.group(1)}/{scp.group(2)}" if scp else url


def tool_version() -> str:
    import tomllib

    return tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["version"]


def _git(*arguments: str) -> str:
    completed = subprocess.run(["git", "-C", str(REPOSITORY), *arguments], capture_output=True, text=True)
    return completed.stdout.strip() if completed.returncode == 0 else ""


class BundleAnswers(Extension):
    def preprocess(self, source: str, name, filename=None) -> str:
        """The project folder's name is rendered first: check the answers there, before it is created."""
        if source.replace(" ", "") == PROJECT_FOLDER:
            return "{{ refuse_bad_answers(cookiecutter) }}" + source
        return source

    def __init__(self, environment):
        super().__init__(environment)
        environment.globals.update(
            default_node_type=answers.default_node_type,
            default_cpu_node_type=answers.default_cpu_node_type,
            default_spark_version=clusters.default_spark_version,
            job_cluster=answers.job_cluster,
            is_serverless=answers.is_serverless,
            nodes_and_gpus=answers.nodes_and_gpus,
            default_accelerator_count=serverless.default_accelerator_count,
            chosen_engines=answers.chosen_engines,
            torch_engines=answers.torch_engines,
            train_arguments=answers.train_arguments,
            gpus_per_node=clusters.gpus_per_node,
            connect_version=clusters.databricks_connect_version,
            tool_requirement=tool_requirement,
            refuse_bad_answers=refuse_bad_answers,
            versions=versions(),
            shared_source=str(SHARED_SOURCE),
        )
        environment.filters["to_yaml"] = _to_yaml
