"""Bound every wait on the workspace from the very first request, the SDK's own included.

The SDK builds its `Config` with a request of its own (the host's `/.well-known/databricks-config`), retried for
its `retry_timeout_seconds` (300 s by default) before any call of ours, and retries connection errors of every
later call the same way. `WorkspaceLink` is the transport (a requests adapter) that the SDK sends every request
through, so it sees them all, from the first:

- until the workspace has answered once (any HTTP status), a host that refuses, does not resolve, or accepts and
  never answers is given `reach_seconds` from the first request in all: connection errors are tried again here,
  every second, and each request waits at most until that deadline; then `WorkspaceUnreachable`, which the SDK
  does not retry;
- once it has answered, a run of failures (no answer, 429, 5xx) ends `patience_seconds` after it began: each
  request waits at most until then, and the next one raises `WorkspaceUnavailable`.

OAuth token requests use a transport of their own, and an auth type that calls the Databricks CLI runs it as a
process: neither goes through here.
"""

from __future__ import annotations

import threading
import time
from typing import Callable
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from .retry_policy import WorkspaceUnavailable

TRANSIENT_STATUSES = {429, 500, 502, 503, 504}
RECONNECT_EVERY = 1.0  # seconds between two tries to open a connection the host refused
SHORTEST_WAIT = 0.05  # a request is never given less than this to answer


class WorkspaceUnreachable(WorkspaceUnavailable):
    """The host never answered: refused, did not resolve, or accepted the connection and sent nothing back."""


class WorkspaceLink(HTTPAdapter):
    def __init__(self, *, reach_seconds: float, patience_seconds: float, reach_option: str = "--connect-timeout",
                 patience_option: str = "--api-patience", clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, **kwargs):
        super().__init__(**kwargs)
        self.reach_seconds = reach_seconds
        self.patience_seconds = patience_seconds
        self._reach_option = reach_option
        self._patience_option = patience_option
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self.first_request_at: float | None = None
        self.answered = False
        self._failing_since: float | None = None
        self._last_failure: str = ""
        self.host: str | None = None

    # --- the bounds -------------------------------------------------------------------------------------------

    def _deadline(self) -> tuple[float | None, str]:
        """When waiting must end, and why: before the first answer, the reach; after it, a run of failures."""
        if not self.answered:
            return self.first_request_at + self.reach_seconds, "reach"
        if self._failing_since is not None:
            return self._failing_since + self.patience_seconds, "patience"
        return None, ""

    def _give_up(self, why: str) -> WorkspaceUnavailable:
        host = self.host or "the workspace"
        last = f" ({self._last_failure})" if self._last_failure else ""
        if why == "reach":
            return WorkspaceUnreachable(
                f"no answer from the workspace at {host} in {self.reach_seconds:g} s{last}; fix: check the host "
                f"(DATABRICKS_HOST, or the host of the profile you use), the network, VPN or proxy, then run again "
                f"(or wait longer with {self._reach_option})")
        failing_for = self._clock() - (self._failing_since or self._clock())
        return WorkspaceUnavailable(
            f"the workspace at {host} has answered only with transient errors, or not at all, for "
            f"{failing_for:.1f} s{last}; "
            f"fix: check the workspace's status and run again (or wait longer with {self._patience_option})")

    @staticmethod
    def _clamped(timeout, remaining: float):
        remaining = max(SHORTEST_WAIT, remaining)
        if isinstance(timeout, tuple):
            return tuple(remaining if part is None else min(part, remaining) for part in timeout)
        if isinstance(timeout, (int, float)):
            return min(timeout, remaining)
        return remaining if timeout is None else timeout

    # --- the transport ----------------------------------------------------------------------------------------

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        with self._lock:
            if self.first_request_at is None:
                self.first_request_at = self._clock()
                parts = urlsplit(request.url)
                self.host = f"{parts.scheme}://{parts.netloc}"
        while True:
            started = self._clock()
            deadline, why = self._deadline()
            if deadline is not None:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise self._give_up(why)
                timeout = self._clamped(timeout, remaining)
            try:
                response = super().send(request, stream=stream, timeout=timeout, verify=verify, cert=cert,
                                        proxies=proxies)
            except (requests.ConnectionError, requests.Timeout) as error:
                self._failed(describe_failure(error), started)
                if self.answered:
                    raise  # the SDK and `Patience` retry it, within the run's deadline
                if not _not_sent(error):
                    # Sent, and nothing came back before the reach deadline, to which the wait was clamped.
                    if self._clock() >= self.first_request_at + self.reach_seconds - SHORTEST_WAIT:
                        raise self._give_up("reach") from error
                    raise
                remaining = self.first_request_at + self.reach_seconds - self._clock()
                if remaining <= 0:
                    raise self._give_up("reach") from error
                self._sleep(min(RECONNECT_EVERY, remaining))
                continue
            with self._lock:
                self.answered = True
                if response.status_code in TRANSIENT_STATUSES:
                    if self._failing_since is None:
                        self._failing_since = started
                    self._last_failure = f"HTTP {response.status_code}"
                else:
                    self._failing_since = None
                    self._last_failure = ""
            return response

    def _failed(self, description: str, started: float) -> None:
        with self._lock:
            self._last_failure = description
            if self.answered and self._failing_since is None:
                self._failing_since = started


def _not_sent(error: BaseException) -> bool:
    """Whether the request never left: the connection could not be opened (safe to send again, even a POST)."""
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

    if isinstance(error, requests.ConnectTimeout):
        return True
    reason = getattr(error.args[0], "reason", None) if error.args else None
    return isinstance(reason, (NewConnectionError, ConnectTimeoutError))


def describe_failure(error: BaseException) -> str:
    text = repr(error)
    if isinstance(error, requests.ConnectTimeout):
        return "the connection did not open in time"
    if isinstance(error, requests.ReadTimeout):
        return "it accepted the connection but sent no answer"
    if "NameResolution" in text or "Name or service not known" in text or "getaddrinfo" in text:
        return "the host name does not resolve"
    if "Connection refused" in text or "ConnectionRefused" in text:
        return "the connection was refused"
    if "RemoteDisconnected" in text or "Connection reset" in text or "Connection aborted" in text:
        return "the connection was closed without an answer"
    return type(error).__name__
