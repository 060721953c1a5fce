"""`run JOB_KEY`: the real databricks-sdk WorkspaceClient against a fake Jobs API 2.2 over real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from distributed_training.tooling.cli import main
from support.fake_workspace import DEMO_BUNDLE, DEMO_TAGS, DUMMY_TOKEN, FakeWorkspace, ScriptedRun, snapshot

SRC = Path(__file__).resolve().parents[2] / "src"
BUNDLE = DEMO_BUNDLE.replace("targets:", 'variables:\n  epochs:\n    default: "5"\ntargets:', 1)
FAST = ["--poll-interval", "0.02"]


@pytest.fixture
def workspace():
    with FakeWorkspace() as fake:
        yield fake


@pytest.fixture
def bundle_dir(tmp_path, monkeypatch, workspace):
    """A deployed-looking bundle folder, the current folder, with the SDK's auth pointed at the fake only."""
    for name in list(os.environ):
        if name.startswith("DATABRICKS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DATABRICKS_HOST", workspace.url)
    monkeypatch.setenv("DATABRICKS_TOKEN", DUMMY_TOKEN)
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "no-databrickscfg"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / "databricks.yml").write_text(BUNDLE)
    monkeypatch.chdir(folder)
    return folder


def test_a_successful_run_exits_0_and_shows_each_state(workspace, bundle_dir, capsys):
    workspace.add_job(11, "[dev someone] demo-ray", DEMO_TAGS)
    workspace.script_runs(ScriptedRun([
        snapshot("PENDING", "Waiting for cluster", train="PENDING"),
        snapshot("RUNNING", train="RUNNING"),
        snapshot("SUCCESS", train="SUCCESS"),
    ]))

    code = main(["run", "train_ray", "--param", "epochs=2", *FAST])

    out = capsys.readouterr().out
    assert code == 0, out
    assert "started run" in out and "'[dev someone] demo-ray' (id 11" in out
    lines = out.splitlines()
    assert any("PENDING (Waiting for cluster) | train PENDING" in line for line in lines)
    assert any("RUNNING | train RUNNING" in line for line in lines)
    assert any(line.startswith("run ") and "succeeded" in line and "/jobs/11/runs/" in line for line in lines)
    run_now = workspace.calls("/api/2.2/jobs/run-now")[0].body
    assert run_now["job_id"] == 11 and run_now["job_parameters"] == {"epochs": "2"}
    assert run_now["idempotency_token"]


def test_a_failed_task_exits_1_with_its_error_trace_and_logs(workspace, bundle_dir, capsys):
    workspace.add_job(12, "demo-ray", DEMO_TAGS, tasks=("prepare", "train"))
    trace = "\n".join(f"  frame {index}" for index in range(60)) + "\nRuntimeError: CUDA out of memory"
    workspace.script_runs(ScriptedRun(
        [snapshot("RUNNING", prepare="SUCCESS", train="RUNNING"),
         snapshot("FAILED", "Task train failed with message: Workload failed.", prepare="SUCCESS", train="FAILED")],
        outputs={"train": {"error": "RuntimeError: CUDA out of memory", "error_trace": trace,
                           "logs": "epoch 1 loss 0.9\nepoch 2 loss nan\n"}}))

    code = main(["run", "train_ray", *FAST])

    out = capsys.readouterr().out
    assert code == 1, out
    assert "ended FAILED" in out and "Task train failed" in out
    assert "task train FAILED" in out and "task prepare" not in out
    assert "error: RuntimeError: CUDA out of memory" in out
    assert "error trace, last 40 lines, 21 lines before them not shown" in out
    assert "frame 59" in out and "frame 10\n" not in out
    assert "epoch 2 loss nan" in out
    # the failed task run's own output (the run of a multi-task job has none)
    _, task_run_ids = workspace.last_run
    asked = [int(request.query["run_id"]) for request in workspace.calls("/api/2.2/jobs/runs/get-output")]
    assert asked == [task_run_ids["train"]]


def test_a_run_cancelled_in_the_workspace_exits_1(workspace, bundle_dir, capsys):
    workspace.add_job(13, "demo-ray", DEMO_TAGS)
    workspace.script_runs(ScriptedRun([snapshot("RUNNING", train="RUNNING"),
                                       snapshot("CANCELED", "Run cancelled by someone@example.com",
                                                train="CANCELED")]))

    code = main(["run", "train_ray", *FAST])

    out = capsys.readouterr().out
    assert code == 1
    assert "ended CANCELED" in out and "cancelled by someone@example.com" in out
    assert "task train CANCELED" in out
    assert not workspace.calls("/api/2.2/jobs/runs/get-output")  # a cancelled task has no error to show


def test_transient_500_503_429_while_polling_are_ridden_out(workspace, bundle_dir, capsys):
    workspace.add_job(14, "demo-ray", DEMO_TAGS)
    workspace.script_runs(ScriptedRun([snapshot("RUNNING", train="RUNNING"), snapshot("RUNNING", train="RUNNING"),
                                       snapshot("SUCCESS", train="SUCCESS")]))
    workspace.fail_next("/api/2.2/jobs/list", 500)
    workspace.fail_next("/api/2.2/jobs/run-now", 503, 500)
    workspace.fail_next("/api/2.2/jobs/runs/get", 500, 503, 429, 500)

    code = main(["run", "train_ray", *FAST])

    out = capsys.readouterr().out
    assert code == 0, out
    assert "transient error (InternalError" in out
    assert len(workspace.calls("/api/2.2/jobs/run-now")) == 3
    tokens = {request.body["idempotency_token"] for request in workspace.calls("/api/2.2/jobs/run-now")}
    assert len(tokens) == 1  # the same token each time: one run, however often run-now was sent
    assert len(workspace.calls("/api/2.2/jobs/runs/get")) >= 3 + 4


def test_a_workspace_that_keeps_failing_ends_with_a_clear_error(workspace, bundle_dir, capsys):
    workspace.add_job(15, "demo-ray", DEMO_TAGS)
    workspace.script_runs(ScriptedRun([snapshot("RUNNING", train="RUNNING")]))
    workspace.fail_next("/api/2.2/jobs/runs/get", *[500] * 1000)

    code = main(["run", "train_ray", *FAST, "--api-patience", "0.3"])

    captured = capsys.readouterr()
    assert code == 2
    assert "only with transient errors" in captured.err and "may still be going" in captured.err


def test_a_run_that_never_ends_stops_at_the_timeout_with_a_distinct_code(workspace, bundle_dir, capsys):
    workspace.add_job(16, "demo-ray", DEMO_TAGS)
    workspace.script_runs(ScriptedRun([snapshot("RUNNING", train="RUNNING")]))

    started = time.monotonic()
    code = main(["run", "train_ray", *FAST, "--timeout", "0.4"])

    out = capsys.readouterr().out
    assert code == 124
    assert time.monotonic() - started < 5
    assert "gave up waiting after 0.4 s (--timeout)" in out and "still going (RUNNING)" in out
    assert "databricks jobs cancel-run" in out and "/jobs/16/runs/" in out
    assert not workspace.calls("/api/2.2/jobs/runs/cancel")


def test_no_wait_starts_the_run_and_prints_its_page(workspace, bundle_dir, capsys):
    workspace.add_job(17, "demo-ray", DEMO_TAGS)

    code = main(["run", "train_ray", "--no-wait"])

    out = capsys.readouterr().out
    assert code == 0
    assert "run page: " + workspace.url + "/jobs/17/runs/" in out
    assert len(workspace.calls("/api/2.2/jobs/runs/get")) == 1


def test_a_job_not_deployed_names_bundle_target_key_and_the_deploy_command(workspace, bundle_dir, capsys):
    workspace.add_job(18, "demo-ray", {**DEMO_TAGS, "target": "prod"})
    workspace.add_job(19, "other", {"bundle": "other", "job_key": "train_ray", "target": "dev"})

    code = main(["run", "train_ray", *FAST])

    err = capsys.readouterr().err
    assert code == 2
    assert "'train_ray'" in err and "bundle 'demo'" in err and "target 'dev'" in err
    assert "databricks bundle deploy -t dev" in err
    assert not workspace.calls("/api/2.2/jobs/run-now")


def test_the_job_is_found_on_a_later_page_of_the_jobs_list(workspace, bundle_dir, capsys):
    for job_id in range(100, 250):
        workspace.add_job(job_id, f"job {job_id}", {"bundle": "elsewhere"})
    workspace.add_job(20, "demo-ray", {**DEMO_TAGS, "target": "prod"})  # oldest: last page

    code = main(["run", "train_ray", "-t", "prod", *FAST])

    assert code == 0, capsys.readouterr()
    assert len(workspace.calls("/api/2.2/jobs/list")) == 2
    assert workspace.calls("/api/2.2/jobs/run-now")[0].body["job_id"] == 20


def test_several_matching_jobs_are_narrowed_to_the_current_users_else_listed(workspace, bundle_dir, capsys):
    workspace.add_job(21, "[dev someone] demo-ray", DEMO_TAGS, creator="someone@example.com")
    workspace.add_job(22, "[dev other] demo-ray", DEMO_TAGS, creator="other@example.com")
    assert main(["run", "train_ray", *FAST]) == 0
    assert workspace.calls("/api/2.2/jobs/run-now")[0].body["job_id"] == 21

    workspace.add_job(23, "[dev someone] demo-ray (copy)", DEMO_TAGS, creator="someone@example.com")
    capsys.readouterr()
    assert main(["run", "train_ray", *FAST]) == 2
    err = capsys.readouterr().err
    assert "3 jobs carry the tags" in err
    assert all(f"job {job_id}:" in err for job_id in (21, 22, 23))


def test_the_job_id_is_read_from_the_local_terraform_state(workspace, bundle_dir, capsys):
    workspace.add_job(31, "demo-ray", tags={})  # no tags: only the state file can find it
    state = bundle_dir / ".databricks" / "bundle" / "dev" / "terraform" / "terraform.tfstate"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"version": 4, "resources": [
        {"mode": "managed", "type": "databricks_job", "name": "train_other",
         "instances": [{"attributes": {"id": "30"}}]},
        {"mode": "managed", "type": "databricks_job", "name": "train_ray",
         "instances": [{"attributes": {"id": "31", "name": "demo-ray"}}]},
    ]}))

    code = main(["run", "train_ray", *FAST])

    out = capsys.readouterr().out
    assert code == 0, out
    assert "from .databricks/bundle/dev/terraform/terraform.tfstate" in out
    assert workspace.calls("/api/2.2/jobs/run-now")[0].body["job_id"] == 31
    assert not workspace.calls("/api/2.2/jobs/list")


def test_a_stale_state_file_falls_back_to_the_tags(workspace, bundle_dir, capsys):
    workspace.add_job(33, "demo-ray", DEMO_TAGS)
    state = bundle_dir / ".databricks" / "bundle" / "dev" / "resources.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"state_version": 2, "lineage": "x", "serial": 3,
                                 "state": {"resources.jobs.train_ray": {"__id__": "32", "state": {}}}}))

    code = main(["run", "train_ray", *FAST])

    out = capsys.readouterr().out
    assert code == 0, out
    assert "job 32, recorded in .databricks/bundle/dev/resources.json, no longer exists" in out
    assert workspace.calls("/api/2.2/jobs/run-now")[0].body["job_id"] == 33


def test_runs_that_carry_only_the_newer_status_field_read_the_same(bundle_dir, capsys, monkeypatch):
    with FakeWorkspace(include_state=False) as workspace:
        monkeypatch.setenv("DATABRICKS_HOST", workspace.url)
        workspace.add_job(34, "demo-ray", DEMO_TAGS)
        workspace.script_runs(ScriptedRun([snapshot("RUNNING", train="RUNNING"), snapshot("SUCCESS", train="SUCCESS")]),
                              ScriptedRun([snapshot("FAILED", train="FAILED")], outputs={"train": {"error": "boom"}}))
        assert main(["run", "train_ray", *FAST]) == 0
        assert main(["run", "train_ray", *FAST]) == 1
    out = capsys.readouterr().out
    assert "ended RUN_EXECUTION_ERROR" in out and "error: boom" in out


def test_ctrl_c_without_a_terminal_cancels_the_run(workspace, bundle_dir, capsys):
    workspace.add_job(40, "demo-ray", DEMO_TAGS)
    workspace.script_runs(ScriptedRun([snapshot("RUNNING", train="RUNNING")]))  # it never ends by itself

    def press_ctrl_c_once_it_is_followed():
        deadline = time.monotonic() + 30
        while len(workspace.calls("/api/2.2/jobs/runs/get")) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT: Python raises KeyboardInterrupt in the main thread

    presser = threading.Thread(target=press_ctrl_c_once_it_is_followed)
    presser.start()
    code = main(["run", "train_ray", *FAST])
    presser.join()

    out = capsys.readouterr().out
    assert code == 130, out
    assert "no terminal to ask on: cancelling run" in out
    run_id, _ = workspace.last_run
    assert [request.body["run_id"] for request in workspace.calls("/api/2.2/jobs/runs/cancel")] == [run_id]
    assert f"cancel requested for run {run_id}" in out


def test_bad_usage_is_reported_before_any_call(workspace, bundle_dir, capsys, tmp_path):
    assert main(["run", "train_ray", "-t", "staging"]) == 2
    assert "target 'staging' is not declared" in capsys.readouterr().err
    assert main(["run", "train_ray", "--bundle-dir", str(tmp_path / "nowhere")]) == 2
    assert "no databricks.yml" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "train_ray", "--param", "epochs"])
    assert exit_info.value.code == 2 and "is not KEY=VALUE" in capsys.readouterr().err
    assert workspace.requests == []


def test_a_refused_token_is_an_error_not_a_retry(workspace, bundle_dir, capsys, monkeypatch):
    workspace.add_job(42, "demo-ray", DEMO_TAGS)
    monkeypatch.setenv("DATABRICKS_TOKEN", "not-the-token")

    assert main(["run", "train_ray", *FAST]) == 2
    assert "Invalid access token" in capsys.readouterr().err
    assert len(workspace.calls("/api/2.2/jobs/list")) == 1

    monkeypatch.delenv("DATABRICKS_HOST")
    monkeypatch.delenv("DATABRICKS_TOKEN")
    assert main(["run", "train_ray", *FAST]) == 2
    err = capsys.readouterr().err
    assert "cannot authenticate to the workspace" in err and "databricks auth login" in err


def test_on_a_terminal_ctrl_c_asks_and_no_keeps_following_yes_cancels(workspace, bundle_dir):
    workspace.add_job(41, "demo-ray", DEMO_TAGS)
    workspace.script_runs(ScriptedRun([snapshot("RUNNING", train="RUNNING")]))
    terminal = _Terminal([sys.executable, "-m", "distributed_training", "run", "train_ray", *FAST])
    try:
        terminal.read_until("\r[")  # the progress line, rewritten in place
        terminal.interrupt()
        terminal.read_until("[y/N]")
        polls = len(workspace.calls("/api/2.2/jobs/runs/get"))  # none while it waits for the answer
        terminal.type("n\n")
        terminal.read_until("following the run again")
        terminal.read_until("\r[")
        assert len(workspace.calls("/api/2.2/jobs/runs/get")) > polls and not workspace.calls(
            "/api/2.2/jobs/runs/cancel")
        terminal.interrupt()
        terminal.read_until("[y/N]")
        terminal.type("y\n")
        assert terminal.wait() == 130
    finally:
        terminal.close()
    run_id, _ = workspace.last_run
    assert f"cancel requested for run {run_id}" in terminal.output
    assert [request.body["run_id"] for request in workspace.calls("/api/2.2/jobs/runs/cancel")] == [run_id]


class _Terminal:
    """A command on a pseudo-terminal (stdin and stdout are a TTY), read and typed into like a person would."""

    def __init__(self, command: list[str]):
        import pty

        self._master, slave = pty.openpty()
        self.process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave,
                                        env={**os.environ, "PYTHONPATH": str(SRC)})
        os.close(slave)
        self.output = ""

    def read_until(self, text: str, timeout: float = 120) -> None:  # a hang's backstop: the first wait starts Python
        import select

        deadline = time.monotonic() + timeout
        start = len(self.output)
        while text not in self.output[start:]:
            assert time.monotonic() < deadline, f"no {text!r} in: {self.output!r}"
            if select.select([self._master], [], [], 0.1)[0]:
                self.output += os.read(self._master, 4096).decode(errors="replace")

    def interrupt(self) -> None:
        self.process.send_signal(signal.SIGINT)

    def type(self, text: str) -> None:
        os.write(self._master, text.encode())

    def wait(self) -> int:
        code = self.process.wait(timeout=120)
        try:
            while chunk := os.read(self._master, 4096):
                self.output += chunk.decode(errors="replace")
        except OSError:  # the terminal closes with the command
            pass
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self._master)
