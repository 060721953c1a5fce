"""Show a run's progress: one line rewritten in place on a terminal, plain lines in a log.

In a log (stdout is not a terminal) the run page's URL is written once, when first known, then a line when the
summary changes, and at least every `heartbeat` seconds while it does not, so a long step still shows that the
command is alive.
"""

from __future__ import annotations

import shutil
from typing import TextIO

CLEAR_TO_END_OF_LINE = "\x1b[K"


def format_elapsed(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{seconds:02d}s"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class ProgressLine:
    def __init__(self, stream: TextIO, *, interactive: bool, heartbeat: float = 60.0):
        self._stream = stream
        self._interactive = interactive
        self._heartbeat = heartbeat
        self._last_summary: str | None = None
        self._last_written_at = 0.0
        self._url_written = False
        self._line_open = False  # a rewritable line is on screen, not yet ended with a newline

    def show(self, summary: str, elapsed: float, url: str | None) -> None:
        if self._interactive:
            self._rewrite_line(summary, elapsed, url)
        else:
            self._write_lines(summary, elapsed, url)
        self._last_summary = summary
        self._stream.flush()

    def _rewrite_line(self, summary: str, elapsed: float, url: str | None) -> None:
        line = f"[{format_elapsed(elapsed)}] {summary}" + (f" | {url}" if url else "")
        width = shutil.get_terminal_size().columns - 1
        self._stream.write("\r" + line[:width] + CLEAR_TO_END_OF_LINE)
        self._line_open = True

    def _write_lines(self, summary: str, elapsed: float, url: str | None) -> None:
        if url and not self._url_written:
            self._stream.write(f"run page: {url}\n")
            self._url_written = True
        if summary != self._last_summary or elapsed - self._last_written_at >= self._heartbeat:
            self._stream.write(f"[{format_elapsed(elapsed)}] {summary}\n")
            self._last_written_at = elapsed

    def end_line(self) -> None:
        """End the rewritable line, so that what is written next starts on a line of its own."""
        if self._line_open:
            self._stream.write("\n")
            self._stream.flush()
            self._line_open = False
