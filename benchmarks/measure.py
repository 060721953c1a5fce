"""What every benchmark returns: rows of ours against a baseline, and the table they make."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable


@dataclass(frozen=True)
class Row:
    section: str  # engines, data path, generation
    name: str
    ours: float
    baseline: float | None  # None: a time of our own, with nothing to compare it with
    unit: str  # "samples/s", "rows/s", "s"
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """Ours over the baseline (for a rate, 1.0 or more is as fast; for seconds, 1.0 or less)."""
        if self.baseline in (None, 0):
            return None
        return self.ours / self.baseline

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


def seconds(action: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def median(values: list[float]) -> float:
    return statistics.median(values)


def alternate(sides: dict[str, Callable[[], object]], repetitions: int) -> dict[str, list]:
    """Run every side once per repetition, starting each repetition with the next side, so that a slow spell of
    the machine is shared out; returns each side's measurements in order."""
    names = list(sides)
    measured: dict[str, list] = {name: [] for name in names}
    for repetition in range(repetitions):
        shift = repetition % len(names)
        for name in names[shift:] + names[:shift]:
            measured[name].append(sides[name]())
    return measured


def format_table(rows: list[Row]) -> str:
    header = ("section", "measurement", "ours", "baseline", "unit", "ratio", "note")
    lines = [header]
    for row in rows:
        lines.append((
            row.section, row.name, _number(row.ours), "-" if row.baseline is None else _number(row.baseline),
            row.unit, "-" if row.ratio is None else f"{row.ratio:.2f}", row.note,
        ))
    widths = [max(len(line[column]) for line in lines) for column in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths)) + "  " + line[-1] for line in lines
    )


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
