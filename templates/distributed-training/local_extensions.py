"""Jinja extension for the template: the tool's answer logic, available while rendering, and the answer checks.

Cookiecutter puts this folder on sys.path for `_extensions`; the tool lives two folders up, in the repository's
`src/` (the template is always used from a checkout or a clone of the whole repository).

The answers are checked while cookiecutter renders the project folder's name, which it does before it creates
anything: a refusal leaves nothing behind (a pre_gen_project hook runs only once the folder, and its parents for a
`project_slug` with a '/', exist). The refusal is cookiecutter's own FailedHookException, which its command line
prints as a message, not a traceback.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

import yaml
from jinja2.ext import Extension

REPOSITORY = Path(__file__).resolve().parents[2]
SHARED_SOURCE = REPOSITORY / "src"
if str(SHARED_SOURCE) not in sys.path:
    sys.path.insert(0, str(SHARED_SOURCE))

from distributed_training.tooling import answers, cluster_specs, serverless  # noqa: E402  (needs the path above)
from distributed_training.compute.runtime import versions  # noqa: E402
from distributed_training.findings import Finding  # noqa: E402

TOOL = "distributed-training[validate,remote]"
WHEELS = "wheels"  # the project's folder for the tool's wheel, when it comes from a checkout with no remote
PROJECT_FOLDER = "{{cookiecutter.project_slug}}"  # the template's folder: its name is rendered before anything is written
# A template or origin URL of a repository elsewhere: a URL (not file://), git@host:..., or cookiecutter's abbreviations.
REMOTE = re.compile(r"^(git\+)?((?!file:)\w+://|[\w.-]+@[\w.-]+:|gh:|gl:|bb:)")
WEB_SCHEMES = ("http", "https")
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


def prepare_tool(cookiecutter) -> str:
    """Nothing; while the project folder's name renders, before anything is written: the warnings about the tool's
    git source, or the tool's wheel built (a failure refuses the generation)."""
    if not tool_git_source(cookiecutter["_template"]):
        tool_wheel()
    return ""


def tool_requirement(cookiecutter) -> str:
    """Where a generated project gets this repository's tooling (validate, advise, run) as a development dependency,
    as a requirement that installs on a CI runner and nowhere else than from here.

    From a git repository elsewhere (the template's URL, or the origin of the checkout it was generated from): that
    repository at this commit, over https, with no credentials (warnings say what was changed, and whether the commit
    is on no remote branch). Else, from a checkout with no remote: this checkout's tool, built as a wheel into the
    project's `wheels/` folder, under a version with a local label (`0.1.0+local<hash of its source>`). PyPI refuses
    local versions (pypi/warehouse `warehouse/forklift/metadata.py`, `_validate_metadata`) and `==` with a local label
    matches that label only (PEP 440, "Version matching"), so no package published under the tool's name can stand
    in for it. Not a relative `file:` reference: the project's own wheel, which every job installs, carries its extras'
    requirements, and pip before 24.1 cannot parse such a line (nor install that wheel), nor can uv install it.
    Never a path of the machine that generated it."""
    source = tool_git_source(cookiecutter["_template"])
    if source:
        return f"{TOOL} @ git+{source}"
    wheel = tool_wheel()
    wheels = Path(cookiecutter["_output_dir"]) / cookiecutter["project_slug"] / WHEELS
    wheels.mkdir(exist_ok=True)
    shutil.copy2(wheel, wheels / wheel.name)
    return f"{TOOL}=={wheel.name.split('-')[1]}"


def tool_git_source(template: str) -> str:
    """`URL@commit` of the tool in a git repository elsewhere, fetchable over https; empty for a checkout with no
    remote (or a local one)."""
    url = template if REMOTE.match(template) else _git("config", "--get", "remote.origin.url")
    commit = _git("rev-parse", "HEAD")
    if not (url and REMOTE.match(url) and commit):
        return ""
    fetchable = pip_git_url(url)
    where = {"file": "pyproject.toml", "path": "project.optional-dependencies.test", "severity": "warning"}
    given = urllib.parse.urlsplit(_spelled_out(url))
    if given.scheme not in WEB_SCHEMES:
        _warn_once(Finding("tool-url-https", f"the template's git URL {url} is written as {fetchable}: a CI runner "
                           "has no ssh key to clone with", "if the repository is reachable only over ssh, change "
                           "that line of pyproject.toml back and give the runner a deploy key", **where))
    elif given.username or given.password:
        _warn_once(Finding("tool-url-credentials", f"the template's git URL carried credentials for {given.hostname}: "
                           f"written without them, as {fetchable}", "give the CI runner its own access to a private "
                           "repository (a token through git's credential helper or url.<base>.insteadOf), never in "
                           "pyproject.toml", **where))
    if not _git("branch", "-r", "--contains", commit):
        _warn_once(Finding("tool-commit-not-pushed", f"the template's commit {commit[:12]} is on no remote branch: "
                           f"pip cannot fetch it from {fetchable}", "push it (git push) before the project's CI "
                           "runs, or generate again from a pushed commit", **where))
    return f"{fetchable}@{commit}"


def pip_git_url(url: str) -> str:
    """A git URL as pip takes it after `git+`, which a CI runner with no ssh key can clone: cookiecutter's gh:/gl:/bb:
    abbreviations spelled out, ssh (scp-style `git@host:org/repo`, `ssh://`) and `git://` as https://host/org/repo,
    and any user name or token removed."""
    url = _spelled_out(url)
    scp = re.fullmatch(r"(?:[\w.-]+@)?([\w.-]+):(?!//)(.+)", url)
    if scp:
        return f"https://{scp.group(1)}/{scp.group(2)}"
    parts = urllib.parse.urlsplit(url)
    keeps_port = parts.scheme in WEB_SCHEMES and parts.port  # an ssh port is not the https one
    host = f"{parts.hostname}:{parts.port}" if keeps_port else parts.hostname
    scheme = parts.scheme if parts.scheme in WEB_SCHEMES else "https"
    return urllib.parse.urlunsplit((scheme, host, parts.path, parts.query, parts.fragment))


def _spelled_out(url: str) -> str:
    url = url.removeprefix("git+")
    for short, long in ABBREVIATIONS.items():
        if url.startswith(short):
            return long + url[len(short):]
    return url


@functools.cache
def tool_wheel() -> Path:
    """This checkout's tool as a wheel, its version's local label a hash of the source it is built from. Built once
    per process, so that every file of a project names the same wheel however the checkout changes meanwhile, and in
    a folder of its own (the checkout is left as it is)."""
    sources = [REPOSITORY / "pyproject.toml", REPOSITORY / "README.md", *(REPOSITORY / "src").rglob("*")]
    files = sorted(name for name in (path.relative_to(REPOSITORY) for path in sources if path.is_file())
                   if "__pycache__" not in name.parts and not any(part.endswith(".egg-info") for part in name.parts))
    digest = hashlib.sha256()
    for name in files:
        digest.update(str(name).encode() + b"\0" + (REPOSITORY / name).read_bytes() + b"\0")
    version = f"{tool_version()}+local{digest.hexdigest()[:12]}"
    build = Path(tempfile.mkdtemp(prefix="distributed-training-wheel-"))
    atexit.register(shutil.rmtree, build, ignore_errors=True)
    source = build / "source"
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPOSITORY / name, source / name)
    pyproject = source / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(f'version = "{tool_version()}"', f'version = "{version}"', 1))
    # With setuptools at hand, no index is needed; without it, pip fetches the build requirements from one.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *isolation, "--wheel-dir",
                            str(build), str(source)], capture_output=True, text=True)
    wheels = list(build.glob("*.whl"))
    if built.returncode != 0 or len(wheels) != 1:
        from cookiecutter.exceptions import FailedHookException

        print(built.stdout + built.stderr, file=sys.stderr)
        message = (f"Nothing was generated: the tool's wheel (for the project's `test` extra) did not build from "
                   f"{REPOSITORY} (pip's output above). Install pip and setuptools>=69 where cookiecutter runs, or "
                   "generate from the repository's git URL.")
        print(f"\n{message}", file=sys.stderr)
        raise FailedHookException(message)
    return wheels[0]


_WARNED: set[Finding] = set()


def _warn_once(finding: Finding) -> None:
    """Printed once however many of the project's files name the tool."""
    if finding not in _WARNED:
        _WARNED.add(finding)
        print(finding, file=sys.stderr)


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
            return "{{ refuse_bad_answers(cookiecutter) }}{{ prepare_tool(cookiecutter) }}" + source
        return source

    def __init__(self, environment):
        super().__init__(environment)
        environment.globals.update(
            default_node_type=answers.default_node_type,
            default_cpu_node_type=answers.default_cpu_node_type,
            default_spark_version=cluster_specs.default_spark_version,
            job_cluster=answers.job_cluster,
            scoring_cluster=answers.scoring_cluster,
            is_serverless=answers.is_serverless,
            nodes_and_gpus=answers.nodes_and_gpus,
            default_accelerator_count=serverless.default_accelerator_count,
            chosen_engines=answers.chosen_engines,
            torch_engines=answers.torch_engines,
            train_arguments=answers.train_arguments,
            task_packages=answers.task_packages,
            gpus_per_node=cluster_specs.gpus_per_node,
            connect_version=cluster_specs.databricks_connect_version,
            tool_requirement=tool_requirement,
            prepare_tool=prepare_tool,
            refuse_bad_answers=refuse_bad_answers,
            versions=versions(),
            shared_source=str(SHARED_SOURCE),
        )
        environment.filters["to_yaml"] = _to_yaml
