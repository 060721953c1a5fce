"""`run` never waits silently: every case ends within its bound with one line that names the problem and the fix.

Each case runs `python -m distributed_training run ...` as a user would (a process of its own, the real
databricks-sdk over real HTTP) against one of: a fake workspace (`support.fake_workspace`), a port that accepts
connections and never answers, or a port that refuses them. Each asserts the exit code, the rule and the fix in
the message, a single line on stderr, no traceback, and the time it took. The SDK makes its own first request
while it reads its configuration: the bounds hold from that one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from support.fake_workspace import DEMO_BUNDLE as BUNDLE, DEMO_TAGS, DUMMY_TOKEN, FakeWorkspace

SRC = Path(__file__).resolve().parents[2] / "src"
NO_JOBS = "bundle:\n  name: demo\n"


@dataclass
class Case:
    name: str
    host: str  # "fake" (a FakeWorkspace), "silent" (accepts, never answers), "refusing", "none" (no host set)
    arguments: list[str]
    expected: list[str]  # what the one error line must say: the rule and the fix
    within: float  # seconds, on top of what starting the command takes (start_seconds)
    exit_code: int = 2
    bundle: str = BUNDLE
    token: str = DUMMY_TOKEN
    setup: Callable[[FakeWorkspace], None] | None = None
    no_request: bool = False  # nothing may reach the workspace
    one_line: bool = True  # argparse's own usage errors come with the usage line
    env: dict[str, str] = field(default_factory=dict)


def _stalls_after_the_first_answer(workspace: FakeWorkspace) -> None:
    workspace.add_job(11, "demo-ray", DEMO_TAGS)
    workspace.stall_next("/api/2.2/jobs/list")


def _fails_with(status: int) -> Callable[[FakeWorkspace], None]:
    def setup(workspace: FakeWorkspace) -> None:
        workspace.add_job(11, "demo-ray", DEMO_TAGS)
        workspace.fail_next("/api/2.2/jobs/list", *[status] * 100_000)
    return setup


def _job(workspace: FakeWorkspace) -> None:
    workspace.add_job(11, "demo-ray", DEMO_TAGS)


CASES = [
    # the job key and the bundle: read from the files, before any request
    Case("unknown job key, close to one", "fake", ["train_rya"],
         ["job key 'train_rya' is not in resources.jobs", "its jobs: train_ray", "fix: did you mean train_ray?"],
         within=1, no_request=True),
    Case("unknown job key, far from any", "fake", ["nightly_etl"],
         ["job key 'nightly_etl' is not in resources.jobs", "fix:", "train_ray"], within=1, no_request=True),
    Case("unknown job key on a dead host: no wait", "silent", ["train_rya", "--connect-timeout", "30"],
         ["job key 'train_rya' is not in resources.jobs", "fix:"], within=1),
    Case("a bundle with no jobs", "fake", ["train_ray"],
         ["the bundle declares no jobs", "fix:", "--bundle-dir"], within=1, bundle=NO_JOBS, no_request=True),
    Case("an undeclared target", "fake", ["train_ray", "-t", "prd"],
         ["target 'prd' is not declared", "fix: pass --target prod"], within=1, no_request=True),
    Case("no bundle in the folder", "fake", ["train_ray", "--bundle-dir", "nowhere"],
         ["no databricks.yml", "fix:", "--bundle-dir"], within=1, no_request=True),
    # a host that never answers: bounded from the SDK's own first request
    Case("a host that accepts and never answers", "silent", ["train_ray", "--connect-timeout", "2"],
         ["no answer from the workspace at http://127.0.0.1:", "in 2 s", "sent no answer", "fix: check the host",
          "--connect-timeout"], within=2 + 2),
    Case("a host that refuses connections", "refusing", ["train_ray", "--connect-timeout", "2"],
         ["no answer from the workspace", "connection was refused", "fix: check the host"], within=2 + 2),
    Case("a silent host under a shorter --api-patience", "silent",
         ["train_ray", "--connect-timeout", "60", "--api-patience", "2"],
         ["no answer from the workspace", "fix: check the host"], within=2 + 2),
    # a workspace that answered once, then stops answering or fails
    Case("the jobs list never answers", "fake", ["train_ray", "--api-patience", "2"],
         ["answered only with transient errors", "fix: check the workspace's status", "--api-patience"], within=2 + 2, setup=_stalls_after_the_first_answer),
    Case("every call answers 500", "fake", ["train_ray", "--api-patience", "1.5", "--poll-interval", "0.2"],
         ["only with transient errors", "500", "fix: check the workspace's status"], within=1.5 + 2,
         setup=_fails_with(500)),
    Case("every call answers 503 (the SDK retries inside)", "fake", ["train_ray", "--api-patience", "2"],
         ["only with transient errors", "fix: check the workspace's status"], within=2 + 3, setup=_fails_with(503)),
    # credentials
    Case("no host and no profile", "none", ["train_ray"],
         ["cannot authenticate to the workspace", "fix: `databricks auth login"], within=2),
    Case("a token the workspace refuses", "fake", ["train_ray"],
         ["the workspace refused", "Invalid access token", "fix: check the token"], within=2, token="wrong",
         setup=_job),
    # options that would make a wait unbounded or meaningless
    *[Case(f"--{option} {value}", "fake", ["train_ray", f"--{option}", value],
           [f"--{option}", "give a finite number" if value in ("inf", "nan") else "above 0"], within=1,
           no_request=True, one_line=False)
      for option in ("api-patience", "connect-timeout", "timeout") for value in ("inf", "nan", "0")],
]


@pytest.fixture(scope="module")
def start_seconds() -> float:
    """What starting the command costs here and now (Python, the SDK, the bundle reader), with margin: the bounds
    below are what `run` waits on top of it, so a busy machine does not make them flaky."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    script = ("import databricks.sdk, distributed_training.tooling.remote.run, "
              "distributed_training.tooling.bundle.loader")
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    return 2 * (time.monotonic() - started) + 1.5


@pytest.fixture
def silent_port():
    """A port that accepts connections (the kernel completes them) and never reads or answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield listener.getsockname()[1]
    listener.close()


@pytest.fixture
def refusing_port():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    return port


def _run(folder: Path, host: str | None, case: Case) -> tuple[subprocess.CompletedProcess, float]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("DATABRICKS_")}
    env.update(PYTHONPATH=str(SRC), NO_PROXY="127.0.0.1,localhost", HOME=str(folder.parent),
               DATABRICKS_CONFIG_FILE=str(folder.parent / "no-databrickscfg"), **case.env)
    if host is not None:
        env.update(DATABRICKS_HOST=host, DATABRICKS_TOKEN=case.token)
    started = time.monotonic()
    completed = subprocess.run([sys.executable, "-m", "distributed_training", "run", *case.arguments,
                                "--poll-interval", "0.05"] if "--poll-interval" not in case.arguments else
                               [sys.executable, "-m", "distributed_training", "run", *case.arguments],
                               cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    return completed, time.monotonic() - started


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_run_ends_in_time_with_one_line_naming_the_rule_and_the_fix(case, tmp_path, silent_port, refusing_port,
                                                                   start_seconds):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "databricks.yml").write_text(case.bundle)
    if case.host == "fake":
        with FakeWorkspace() as workspace:
            if case.setup:
                case.setup(workspace)
            completed, took = _run(folder, workspace.url, case)
            requests = list(workspace.requests)
    else:
        host = {"silent": f"http://127.0.0.1:{silent_port}", "refusing": f"http://127.0.0.1:{refusing_port}",
                "none": None}[case.host]
        completed, took = _run(folder, host, case)
        requests = []

    err = completed.stderr
    assert completed.returncode == case.exit_code, (completed.stdout, err)
    assert "Traceback" not in err + completed.stdout
    lines = [line for line in err.splitlines() if line.strip()]
    error_lines = [line for line in lines if "error:" in line]
    assert len(error_lines) == 1, err
    if case.one_line:
        assert lines == error_lines, err
    for text in case.expected:
        assert text in error_lines[0], err
    assert took < case.within + start_seconds, f"{case.name}: {took:.1f} s (start: {start_seconds:.1f} s)"
    if case.no_request:
        assert requests == []


def test_the_matrix_keeps_its_cases():
    """The matrix is the point: it cannot shrink quietly."""
    assert len(CASES) >= 23
    hosts = {case.host for case in CASES}
    assert {"fake", "silent", "refusing", "none"} <= hosts


def test_the_default_bounds_are_about_a_minute_at_most():
    """A dead host is given --connect-timeout (default 45 s) in all; the cases above prove the bound holds, scaled
    down. Measured with the defaults on 2 cores: a silent host 46 s, a refusing one 47 s."""
    from distributed_training.tooling.cli import build_parser

    defaults = build_parser().parse_args(["run", "train_ray"])
    assert defaults.connect_timeout <= 50
