"""Read a job run (an SDK `Run` or `RunTask`): where it is in its life cycle, whether it is over, how it ended.

Jobs API 2.2 answers with both `state` (life_cycle_state, result_state, state_message) and the newer `status`
(state, termination_details); `state` is read when present, `status` otherwise, so a run reads the same from
either.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

# Life cycle states after which nothing more happens (`state` and `status` spellings).
FINISHED = {"TERMINATED", "SKIPPED", "INTERNAL_ERROR"}
SUCCESS = "SUCCESS"
# Results of tasks that were stopped or never ran: no error of their own to read in their run output.
STOPPED_OR_SKIPPED = {"CANCELED", "USER_CANCELED", "UPSTREAM_FAILED", "UPSTREAM_CANCELED", "EXCLUDED", "DISABLED",
                      "SKIPPED", "MAXIMUM_CONCURRENT_RUNS_REACHED"}
TASKS_NAMED_UP_TO = 6  # more tasks than this are shown as counts per state


@dataclass(frozen=True)
class Phase:
    life_cycle: str  # QUEUED, PENDING, RUNNING, TERMINATING, TERMINATED, ...
    result: str | None  # SUCCESS, FAILED, CANCELED, ... once finished
    message: str  # the service's words on it, often empty

    @property
    def finished(self) -> bool:
        return self.life_cycle in FINISHED

    @property
    def succeeded(self) -> bool:
        return self.finished and self.result == SUCCESS

    @property
    def has_own_error(self) -> bool:
        """Whether it ended in an error of its own (not a cancel, a skip or an upstream failure)."""
        return self.finished and not self.succeeded and self.word not in STOPPED_OR_SKIPPED

    @property
    def word(self) -> str:
        """One word for the phase: the result once there is one, else the life cycle state."""
        return self.result or self.life_cycle


def phase(run) -> Phase:
    state, status = run.state, run.status
    if state is not None and state.life_cycle_state is not None:
        return Phase(state.life_cycle_state.value,
                     state.result_state.value if state.result_state else None,
                     (state.state_message or "").strip())
    if status is not None and status.state is not None:
        details = status.termination_details
        finished = status.state.value in FINISHED
        return Phase(status.state.value,
                     details.code.value if finished and details and details.code else None,
                     ((details.message if details else None) or "").strip())
    return Phase("UNKNOWN", None, "")


def run_summary(run) -> str:
    """The run's phase and its tasks' in one line: `RUNNING (Waiting for cluster) | train RUNNING, eval PENDING`."""
    run_phase = phase(run)
    text = run_phase.word
    if run_phase.message and not run_phase.finished:
        text += f" ({run_phase.message})"
    tasks = run.tasks or []
    if not tasks:
        return text
    if len(tasks) <= TASKS_NAMED_UP_TO:
        task_states = ", ".join(f"{task.task_key} {phase(task).word}" for task in tasks)
    else:
        counts = Counter(phase(task).word for task in tasks)
        task_states = ", ".join(f"{count} {word}" for word, count in counts.most_common())
    return f"{text} | {task_states}"


def unsuccessful_tasks(run) -> list:
    """Tasks of a finished run that did not succeed, in the run's order."""
    return [task for task in run.tasks or [] if not phase(task).succeeded]
