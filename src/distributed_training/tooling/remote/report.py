"""Say how a finished run ended and, when it did not succeed, why: each task's error, trace and last log lines."""

from __future__ import annotations

from typing import TextIO

from .progress import format_elapsed
from .retry_policy import Patience, WorkspaceUnavailable, describe_error
from .run_state import phase, unsuccessful_tasks

TAIL_LINES = 40  # of an error trace or of the logs


def tail(text: str, lines: int = TAIL_LINES) -> tuple[list[str], int]:
    """The last `lines` lines of `text`, and how many lines came before them."""
    all_lines = text.rstrip("\n").splitlines()
    return all_lines[-lines:], max(0, len(all_lines) - lines)


def report_finished(run, elapsed: float, jobs, patience: Patience, out: TextIO) -> None:
    run_phase = phase(run)
    if run_phase.succeeded:
        out.write(f"run {run.run_id} succeeded in {format_elapsed(elapsed)}: {run.run_page_url}\n")
        return
    reason = f": {run_phase.message}" if run_phase.message else ""
    out.write(f"run {run.run_id} ended {run_phase.word} after {format_elapsed(elapsed)}{reason}\n")
    tasks = unsuccessful_tasks(run)
    if not run.tasks and run_phase.has_own_error:
        _write_output(run.run_id, jobs, patience, out, indent="  ")
    for task in tasks:
        task_phase = phase(task)
        message = f": {task_phase.message}" if task_phase.message else ""
        out.write(f"task {task.task_key} {task_phase.word}{message}\n")
        if task_phase.has_own_error and task.run_id is not None:
            _write_output(task.run_id, jobs, patience, out, indent="  ")
    out.write(f"run page: {run.run_page_url}\n")


def _write_output(run_id: int, jobs, patience: Patience, out: TextIO, indent: str) -> None:
    from databricks.sdk.errors import DatabricksError

    try:
        output = patience.call(f"reading the output of run {run_id}", jobs.get_run_output, run_id)
    except (DatabricksError, WorkspaceUnavailable) as error:
        out.write(f"{indent}(its output could not be read: {describe_error(error)})\n")
        return
    if output.error:
        out.write(f"{indent}error: {output.error.strip()}\n")
    for title, text in (("error trace", output.error_trace), ("logs", output.logs)):
        if not text or not text.strip():
            continue
        lines, before = tail(text)
        more = f", {before} lines before them not shown" if before else ""
        truncated = " (truncated by the service)" if title == "logs" and output.logs_truncated else ""
        out.write(f"{indent}{title}{truncated}, last {len(lines)} lines{more}:\n")
        out.writelines(f"{indent}  {line}\n" for line in lines)
