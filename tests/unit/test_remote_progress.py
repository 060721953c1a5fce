"""Reading a run's state (either API field), the progress line, error tails, and patience with transient errors."""

from __future__ import annotations

import io

import pytest
from databricks.sdk.errors import InternalError, PermissionDenied, TooManyRequests
from databricks.sdk.service.jobs import Run

from distributed_training.tooling.remote.progress import CLEAR_TO_END_OF_LINE, ProgressLine, format_elapsed
from distributed_training.tooling.remote.report import tail
from distributed_training.tooling.remote.retry_policy import NO_ANSWER, Patience, WorkspaceUnavailable
from distributed_training.tooling.remote.run_state import phase, run_summary, unsuccessful_tasks


def _run(state=None, status=None, tasks=()):
    answer = {"run_id": 7, "tasks": list(tasks)}
    if state:
        answer["state"] = state
    if status:
        answer["status"] = status
    return Run.from_dict(answer)


def test_state_and_status_read_the_same():
    from_state = phase(_run(state={"life_cycle_state": "TERMINATED", "result_state": "SUCCESS"}))
    from_status = phase(_run(status={"state": "TERMINATED", "termination_details": {"code": "SUCCESS"}}))
    assert from_state.succeeded and from_status.succeeded
    running = phase(_run(status={"state": "RUNNING"}))
    assert not running.finished and running.word == "RUNNING"
    failed = phase(_run(status={"state": "TERMINATED", "termination_details": {"code": "RUN_EXECUTION_ERROR",
                                                                                "message": "Workload failed"}}))
    assert failed.finished and not failed.succeeded and failed.has_own_error and failed.message == "Workload failed"
    assert phase(_run(state={"life_cycle_state": "SKIPPED"})).finished
    assert not phase(_run(state={"life_cycle_state": "TERMINATED", "result_state": "SUCCESS_WITH_FAILURES"})).succeeded


def test_the_summary_names_few_tasks_and_counts_many():
    few = _run({"life_cycle_state": "PENDING", "state_message": "Waiting for cluster"}, tasks=[
        {"task_key": "prepare", "state": {"life_cycle_state": "TERMINATED", "result_state": "SUCCESS"}},
        {"task_key": "train", "state": {"life_cycle_state": "PENDING"}}])
    assert run_summary(few) == "PENDING (Waiting for cluster) | prepare SUCCESS, train PENDING"
    many = _run({"life_cycle_state": "RUNNING"}, tasks=[
        {"task_key": f"t{index}", "state": {"life_cycle_state": "RUNNING" if index < 5 else "PENDING"}}
        for index in range(8)])
    assert run_summary(many) == "RUNNING | 5 RUNNING, 3 PENDING"


def test_only_unsuccessful_tasks_are_reported_and_only_errors_of_their_own_are_read():
    run = _run({"life_cycle_state": "TERMINATED", "result_state": "FAILED"}, tasks=[
        {"task_key": "prepare", "state": {"life_cycle_state": "TERMINATED", "result_state": "SUCCESS"}},
        {"task_key": "train", "state": {"life_cycle_state": "TERMINATED", "result_state": "FAILED"}},
        {"task_key": "evaluate", "state": {"life_cycle_state": "TERMINATED", "result_state": "UPSTREAM_FAILED"}}])
    tasks = unsuccessful_tasks(run)
    assert [task.task_key for task in tasks] == ["train", "evaluate"]
    assert [phase(task).has_own_error for task in tasks] == [True, False]


def test_on_a_terminal_the_line_is_rewritten_in_place():
    stream = io.StringIO()
    line = ProgressLine(stream, interactive=True)
    line.show("PENDING", 3, "https://host/jobs/1/runs/2")
    line.show("RUNNING | train RUNNING", 65, "https://host/jobs/1/runs/2")
    line.end_line()
    line.end_line()
    assert stream.getvalue() == (f"\r[3s] PENDING | https://host/jobs/1/runs/2{CLEAR_TO_END_OF_LINE}"
                                 f"\r[1m05s] RUNNING | train RUNNING | https://host/jobs/1/runs/2"
                                 f"{CLEAR_TO_END_OF_LINE}\n")


def test_in_a_log_lines_come_on_change_and_as_a_heartbeat():
    stream = io.StringIO()
    line = ProgressLine(stream, interactive=False, heartbeat=60)
    for elapsed, summary in ((0, "PENDING"), (5, "PENDING"), (10, "RUNNING"), (50, "RUNNING"), (71, "RUNNING")):
        line.show(summary, elapsed, "https://host/run")
    line.end_line()
    assert stream.getvalue() == "run page: https://host/run\n[0s] PENDING\n[10s] RUNNING\n[1m11s] RUNNING\n"


def test_elapsed_and_tails_read_well():
    assert [format_elapsed(s) for s in (0, 59.9, 61, 3600 * 2 + 5)] == ["0s", "59s", "1m01s", "2h00m05s"]
    assert tail("a\nb\nc\n", 2) == (["b", "c"], 1)
    assert tail("a", 5) == (["a"], 0)


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_patience_retries_transient_errors_and_gives_up_after_its_window():
    clock, notes = _Clock(), []
    patience = Patience(interval=2, give_up_after=10, note=notes.append, clock=clock, sleep=clock.sleep)
    answers = iter([InternalError("boom"), TooManyRequests("slow down"), TimeoutError("sdk gave up"), "ok"])

    def flaky():
        answer = next(answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert patience.call("reading", flaky) == "ok"
    assert len(notes) == 3 and "InternalError: boom" in notes[0] and clock.now == 6

    def down():
        raise InternalError("down")

    assert patience.attempt("reading", down) is NO_ANSWER
    with pytest.raises(WorkspaceUnavailable, match="only with transient errors for 10 s"):
        patience.call("reading", down)

    def refused():
        raise PermissionDenied("no")

    with pytest.raises(PermissionDenied):  # not transient: at once, no note
        patience.call("reading", refused)
    assert len(notes) == 3 + 1 + 5
