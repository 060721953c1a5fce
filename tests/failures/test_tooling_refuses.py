"""The tool's commands refuse what they cannot use at once, in one line that names the rule and the fix.

`run` without credentials: nothing to authenticate with is a usage error before any request, however dead the host
(each case runs `python -m distributed_training run` in a process of its own, with the real databricks-sdk, an empty
HOME and PATH, and --connect-timeout 30: a wait on the host would show in the time it took). Credentials that do
resolve (a token, a profile, a login of the Databricks CLI) still reach a fake workspace and run the job.

`advise` with sizes out of range (0, negative, not finite, beyond any real model or dataset): exit 2 at parsing,
never a traceback, never "inf GB"; the largest accepted shapes print their figures readably.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from distributed_training.tooling.cli import main
from support.fake_workspace import DEMO_BUNDLE, DEMO_TAGS, DUMMY_TOKEN, FakeWorkspace

SRC = Path(__file__).resolve().parents[2] / "src"
BUNDLE = DEMO_BUNDLE.replace("    mode: production\n", "    mode: production\n    workspace:\n      profile: prod\n")
LOGIN_FIX = ["fix: `databricks auth login --host https://<workspace>`", "DATABRICKS_HOST and DATABRICKS_TOKEN",
             "--profile NAME or DATABRICKS_CONFIG_PROFILE"]
LOGGED_IN_CLI = f"""#!/bin/sh
case "$*" in
  *"auth token"*) echo '{{"access_token": "{DUMMY_TOKEN}", "token_type": "Bearer", "expiry": "2099-01-01T00:00:00"}}' ;;
  *) echo '{{"Major": 0, "Minor": 260, "Patch": 0}}' ;;
esac
"""
LOGGED_OUT_CLI = """#!/bin/sh
case "$*" in
  *"auth token"*) echo "Error: cache: databricks OAuth is not configured for this host. Try logging in again" >&2
                  exit 1 ;;
  *) echo '{"Major": 0, "Minor": 260, "Patch": 0}' ;;
esac
"""


# ---------------------------------------------------------------- run: credentials

@dataclass
class Credentials:
    name: str
    host: str | None  # "fake" (a FakeWorkspace with the job), "silent" (accepts, never answers), a URL, or None
    expected: list[str]  # what the one error line says; empty: the run succeeds
    token: str | None = None
    databrickscfg: str | None = None  # written to a file that DATABRICKS_CONFIG_FILE names
    cli: str | None = None  # a `databricks` CLI on PATH
    arguments: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        return bool(self.expected)


def _profile(name: str, host: str = "{host}", token: str | None = None) -> str:
    return f"[{name}]\nhost = {host}\n" + (f"token = {token}\n" if token else "")


CREDENTIALS = [
    Credentials("nothing at all", None,
                ["cannot authenticate", "neither a workspace host nor a token", *LOGIN_FIX]),
    Credentials("a host that does not resolve, no token", "https://dead.invalid",
                ["no token or other credentials are configured for the workspace at https://dead.invalid",
                 *LOGIN_FIX]),
    Credentials("a host that never answers, no token", "silent",
                ["no token or other credentials are configured for the workspace at http://127.0.0.1:", *LOGIN_FIX]),
    Credentials("the workspace itself, no token", "fake", ["no token or other credentials", *LOGIN_FIX]),
    Credentials("a token and no host", None, ["credentials are configured, but no workspace host", *LOGIN_FIX],
                token=DUMMY_TOKEN),
    Credentials("--profile naming a profile without a token", None,
                ["no token or other credentials are configured for the workspace at https://dead.invalid",
                 "(profile dev of ", *LOGIN_FIX],
                databrickscfg=_profile("dev", "https://dead.invalid"), arguments=["--profile", "dev"]),
    Credentials("DATABRICKS_CONFIG_PROFILE naming a profile without a token", None,
                ["for the workspace at https://dead.invalid", "(profile dev of ", *LOGIN_FIX],
                databrickscfg=_profile("dev", "https://dead.invalid"), env={"DATABRICKS_CONFIG_PROFILE": "dev"}),
    Credentials("the target's workspace.profile without a token", None,
                ["for the workspace at https://dead.invalid", "(profile prod of ", *LOGIN_FIX],
                databrickscfg=_profile("prod", "https://dead.invalid"), arguments=["--target", "prod"]),
    Credentials("--profile naming a profile not in the file", None,
                ["cannot authenticate", "has no nope profile configured", *LOGIN_FIX],
                databrickscfg=_profile("dev", "https://dead.invalid"), arguments=["--profile", "nope"]),
    Credentials("the Databricks CLI, not logged in to a host that never answers", "silent",
                ["no token or other credentials are configured for the workspace", *LOGIN_FIX], cli=LOGGED_OUT_CLI),
    # what resolves still works
    Credentials("DATABRICKS_HOST and DATABRICKS_TOKEN", "fake", [], token=DUMMY_TOKEN),
    Credentials("--profile with a host and a token", None, [],
                databrickscfg=_profile("dev", token=DUMMY_TOKEN), arguments=["--profile", "dev"]),
    Credentials("DATABRICKS_CONFIG_PROFILE with a host and a token", None, [],
                databrickscfg=_profile("dev", token=DUMMY_TOKEN), env={"DATABRICKS_CONFIG_PROFILE": "dev"}),
    Credentials("a host and a login of the Databricks CLI", "fake", [], cli=LOGGED_IN_CLI),
]


@pytest.fixture(scope="module")
def start_seconds() -> float:
    """What starting the command costs here and now, with margin: the bound is what `run` waits on top of it."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    script = ("import databricks.sdk, distributed_training.tooling.remote.run, "
              "distributed_training.tooling.bundle.loader")
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    return 2 * (time.monotonic() - started) + 1.5


@pytest.fixture
def silent_port():
    """A port that accepts connections (the kernel completes them) and never answers: connections wait in its
    backlog, where the test looks for them afterwards."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield listener
    listener.close()


def _connections_made(listener: socket.socket) -> int:
    listener.setblocking(False)
    count = 0
    while True:
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1


def _clean_environment(home: Path) -> dict[str, str]:
    """This process's environment without any credentials of the machine it runs on, nor its CLIs."""
    ambient = ("DATABRICKS_", "ARM_", "ACTIONS_ID_TOKEN_", "GOOGLE_CREDENTIALS", "SYSTEM_ACCESSTOKEN")
    env = {name: value for name, value in os.environ.items() if not name.startswith(ambient)}
    env.update(PYTHONPATH=str(SRC), NO_PROXY="127.0.0.1,localhost", HOME=str(home), PATH=str(home / "bin"))
    return env


def _run_command(case: Credentials, tmp_path: Path, host: str | None) -> tuple[subprocess.CompletedProcess, float]:
    home, project = tmp_path / "home", tmp_path / "project"
    (home / "bin").mkdir(parents=True)
    project.mkdir()
    (project / "databricks.yml").write_text(BUNDLE)
    env = _clean_environment(home)
    if case.cli:
        cli = home / "bin" / "databricks"
        cli.write_text(case.cli)
        cli.chmod(0o755)
    if case.databrickscfg:
        config = tmp_path / "databrickscfg"
        config.write_text(case.databrickscfg.format(host=host))
        env["DATABRICKS_CONFIG_FILE"] = str(config)
    elif host:
        env["DATABRICKS_HOST"] = host
    if case.token:
        env["DATABRICKS_TOKEN"] = case.token
    env.update(case.env)
    started = time.monotonic()
    completed = subprocess.run([sys.executable, "-m", "distributed_training", "run", "train_ray", *case.arguments,
                                "--connect-timeout", "30", "--poll-interval", "0.05"],
                               cwd=project, env=env, capture_output=True, text=True, timeout=120)
    return completed, time.monotonic() - started


@pytest.mark.parametrize("case", CREDENTIALS, ids=[case.name for case in CREDENTIALS])
def test_run_without_credentials_is_a_usage_error_at_once(case, tmp_path, silent_port, start_seconds):
    silent = f"http://127.0.0.1:{silent_port.getsockname()[1]}"
    requests = []
    if case.host == "fake" or (case.databrickscfg and not case.refused):
        with FakeWorkspace() as workspace:
            workspace.add_job(11, "demo-ray", DEMO_TAGS)
            completed, took = _run_command(case, tmp_path, workspace.url)
            requests = list(workspace.requests)
    else:
        completed, took = _run_command(case, tmp_path, silent if case.host == "silent" else case.host)

    out, err = completed.stdout, completed.stderr
    assert "Traceback" not in out + err
    if not case.refused:
        assert completed.returncode == 0, (out, err)
        assert "started run" in out and requests
        return
    assert completed.returncode == 2, (out, err)
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for text in case.expected:
        assert text in err, err
    assert took < 3 + start_seconds, f"{case.name}: {took:.1f} s (start: {start_seconds:.1f} s)"
    assert requests == []
    assert _connections_made(silent_port) == 0


# ---------------------------------------------------------------- advise: sizes out of range

GPT2 = ["--model", "gpt2", "--cloud", "aws"]
CLASSICAL = ["--model-type", "classical", "--cloud", "aws"]
SHAPE = ["--params", "1e9", "--layers", "12", "--hidden", "768", "--heads", "12", "--cloud", "aws"]
HUGE = str(10**400)


def _shape_with(flag: str, value: str) -> list[str]:
    arguments = list(SHAPE)
    if flag in arguments:
        arguments[arguments.index(flag) + 1] = value
    else:
        arguments += [flag, value]
    return arguments


ADVISE_REFUSALS = [
    # (arguments, what the error line says)
    ([*GPT2, "--dataset-gb", "0"], "argument --dataset-gb: '0' must be above 0"),
    ([*CLASSICAL, "--dataset-gb", "0"], "argument --dataset-gb: '0' must be above 0"),
    ([*CLASSICAL, "--dataset-gb", "-0"], "'-0' must be above 0"),
    ([*CLASSICAL, "--dataset-gb=-1"], "'-1' must be above 0"),
    ([*CLASSICAL, "--dataset-gb", "1e-400"], "'1e-400' must be above 0"),
    ([*CLASSICAL, "--dataset-gb", "inf"], "'inf' is not a finite size in GB"),
    ([*GPT2, "--dataset-gb", "nan"], "'nan' is not a finite size in GB"),
    ([*CLASSICAL, "--dataset-gb", "1e400"], "'1e400' is not a finite size in GB"),
    ([*CLASSICAL, "--dataset-gb", "1.7e308"], "must be at most 1,000,000,000 GB"),
    ([*GPT2, "--dataset-gb", "1e300"], "must be at most 1,000,000,000 GB"),
    ([*GPT2, "--dataset-gb", "5GB"], "'5GB' is not a size in GB"),
    (_shape_with("--params", "1e308"), "argument --params: '1e308': a model has at least 1 parameter and at most"),
    (_shape_with("--params", "inf"), "'inf' is not a parameter count"),
    (_shape_with("--params", "0.5"), "'0.5': a model has at least 1 parameter"),
    (["--params=-5", *SHAPE[2:]], "'-5': a model has at least 1 parameter"),
    (_shape_with("--hidden", HUGE), "argument --hidden:"),
    (_shape_with("--layers", "1000000001"), "argument --layers: '1000000001' must be at most 1,000,000,000"),
    (_shape_with("--batch-size", "10000000000"), "argument --batch-size: '10000000000' must be at most"),
    (_shape_with("--seq-len", str(10**200)), "argument --seq-len:"),
    (_shape_with("--seq-len", "0"), "argument --seq-len: '0' must be 1 or more"),
    (_shape_with("--vocab", "nan"), "argument --vocab: 'nan' is not a whole number"),
    (_shape_with("--lora-rank", "0"), "argument --lora-rank: '0' must be 1 or more"),
    (_shape_with("--kv-heads", "1.5"), "argument --kv-heads: '1.5' is not a whole number"),
    (["--model-type", "mlp", "--features", HUGE, "--layers", "2", "--hidden", "8", "--cloud", "aws"],
     "argument --features:"),
    (CLASSICAL, "a classical model's advice depends only on the data: give --dataset-gb"),
]


@pytest.mark.parametrize("arguments, message", ADVISE_REFUSALS,
                         ids=[" ".join(arguments)[:80] for arguments, _ in ADVISE_REFUSALS])
def test_advise_refuses_sizes_out_of_range_with_exit_2(arguments, message, capsys):
    try:
        code = main(["advise", *arguments])
    except SystemExit as exit_:  # argparse's usage error, after the usage lines
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2
    assert out == "" and "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and error_lines[0] == err.splitlines()[-1], err
    assert message in error_lines[0], err


@pytest.mark.parametrize("arguments", [
    ["--params", "1e15", "--layers", "1000000000", "--hidden", "1000000000", "--heads", "1000000000",
     "--vocab", "1000000000", "--seq-len", "1000000000", "--batch-size", "1000000000", "--cloud", "aws"],
    ["--model-type", "mlp", "--features", "1000000000", "--layers", "1000000000", "--hidden", "1000000000",
     "--batch-size", "1000000000", "--cloud", "gcp"],
    [*CLASSICAL, "--dataset-gb", "1e9"],
], ids=["the largest transformer", "the largest mlp", "the largest dataset"])
def test_advise_prints_the_largest_accepted_sizes_readably(arguments, capsys):
    """Nothing fits (exit 1), and the figures that say so are finite and short."""
    assert main(["advise", *arguments]) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out.lower()
    assert not re.search(r"\binf\b|\bnan\b", out, re.IGNORECASE), out
    assert not re.search(r"[0-9,]{20}", out), out


def test_the_matrix_keeps_its_cases():
    """The matrices are the point: they cannot shrink quietly."""
    assert len(CREDENTIALS) >= 14 and sum(not case.refused for case in CREDENTIALS) >= 4
    assert len(ADVISE_REFUSALS) >= 23
