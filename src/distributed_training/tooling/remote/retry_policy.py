"""Ride out a workspace that answers with transient errors (HTTP 5xx, 429, dropped connections).

The SDK already retries some of them inside each call: 429 and 503 (after their Retry-After), connection errors
and a few known messages, for up to its `retry_timeout_seconds` (300 s unless configured). Any other 500 (and a
504) reaches the caller at once, as does the SDK's TimeoutError once its own retries are spent. Those are what
`Patience` retries, every `interval` seconds, for as long as the workspace keeps failing, up to `give_up_after`
seconds of nothing but failures.

Calls that are retried must be safe to repeat: reads, cancel, and run-now only with an idempotency token.
"""

from __future__ import annotations

import time
from typing import Callable


class WorkspaceUnavailable(RuntimeError):
    """The workspace answered with nothing but transient errors for longer than we wait."""


class _NoAnswer:
    def __repr__(self) -> str:
        return "NO_ANSWER"


NO_ANSWER = _NoAnswer()  # what `Patience.attempt` returns when the call failed with a transient error


def is_transient(error: BaseException) -> bool:
    """Whether `error` says "try again later" rather than "this request is wrong"."""
    import requests
    from databricks.sdk.errors import DeadlineExceeded, InternalError, TemporarilyUnavailable, TooManyRequests

    transient = (InternalError, TemporarilyUnavailable, TooManyRequests, DeadlineExceeded,
                 TimeoutError, requests.ConnectionError, requests.Timeout)
    return isinstance(error, transient)


def describe_error(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class Patience:
    def __init__(self, *, interval: float, give_up_after: float, note: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.interval = interval
        self.give_up_after = give_up_after
        self._note = note
        self._clock = clock
        self._sleep = sleep
        self._failing_since: float | None = None

    def attempt(self, what: str, call: Callable, *args, **kwargs):
        """One try of `call(*args, **kwargs)`: its result, or NO_ANSWER after a transient error (noted).

        Raises the error if it is not transient, and `WorkspaceUnavailable` once transient errors have lasted
        `give_up_after` seconds without a single good answer in between (from any call of this `Patience`).
        """
        started = self._clock()
        try:
            result = call(*args, **kwargs)
        except Exception as error:
            if not is_transient(error):
                raise
            now = self._clock()
            if self._failing_since is None:
                self._failing_since = started  # the call itself may have waited (the SDK retries inside it)
            failing_for = now - self._failing_since
            if failing_for >= self.give_up_after:
                raise WorkspaceUnavailable(
                    f"{what}: the workspace has answered only with transient errors for {failing_for:.0f} s "
                    f"(last: {describe_error(error)}); fix: check the workspace's status and run again (or wait longer "
                    "with --api-patience)") from error
            self._note(f"{what}: transient error ({describe_error(error)}); trying again")
            return NO_ANSWER
        self._failing_since = None
        return result

    def call(self, what: str, call: Callable, *args, **kwargs):
        """`call(*args, **kwargs)`, tried again every `interval` seconds while it fails with transient errors."""
        while True:
            result = self.attempt(what, call, *args, **kwargs)
            if result is not NO_ANSWER:
                return result
            self._sleep(self.interval)
