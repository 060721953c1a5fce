"""Poll a run until it is over or the wait is: the run as last seen, and whether it finished."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from .progress import ProgressLine
from .retry_policy import NO_ANSWER, Patience
from .run_state import phase, run_summary


@dataclass
class Followed:
    run: object | None  # the SDK Run as last read; None if no read has succeeded yet
    finished: bool


class RunFollower:
    """Follows one run. `follow` can be called again after a KeyboardInterrupt: the clock and deadline carry on."""

    def __init__(self, jobs, run_id: int, *, patience: Patience, progress: ProgressLine, poll_interval: float,
                 timeout: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self._jobs = jobs
        self.run_id = run_id
        self._patience = patience
        self._progress = progress
        self._poll_interval = poll_interval
        self._clock = clock
        self._sleep = sleep
        self._started = clock()
        self._deadline = None if timeout is None else self._started + timeout
        self.last_seen = None

    @property
    def elapsed(self) -> float:
        return self._clock() - self._started

    @property
    def url(self) -> str | None:
        return self.last_seen.run_page_url if self.last_seen is not None else None

    def follow(self) -> Followed:
        while True:
            run = self._patience.attempt(f"reading the state of run {self.run_id}", self._jobs.get_run, self.run_id)
            if run is not NO_ANSWER:
                self.last_seen = run
                self._progress.show(run_summary(run), self.elapsed, run.run_page_url)
                if phase(run).finished:
                    self._progress.end_line()
                    return Followed(run, finished=True)
            if self._deadline is not None and self._clock() >= self._deadline:
                self._progress.end_line()
                return Followed(self.last_seen, finished=False)
            self._sleep(self._poll_interval if self._deadline is None
                        else max(0.0, min(self._poll_interval, self._deadline - self._clock())))
