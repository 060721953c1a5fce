"""What every benchmark returns: rows of our measurements against a baseline's, and the table they make."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Row:
    section: str  # engines, data path, generation
    name: str
    unit: str  # "tokens/s", "rows/s", "s"
    runs: tuple[float, ...]  # ours, every measurement
    baseline_runs: tuple[float, ...] = ()  # empty: a figure of our own, with nothing to compare it with
    note: str = ""
    work: dict = field(default_factory=dict)  # what each side did, where both must do the same (rows, steps)

    @property
    def ours(self) -> float:
        return statistics.median(self.runs)

    @property
    def baseline(self) -> float | None:
        return statistics.median(self.baseline_runs) if self.baseline_runs else None

    @property
    def ratio(self) -> float | None:
        """Ours over the baseline, medians (for a rate, 1.0 or more is as fast; for seconds, 1.0 or less)."""
        if not self.baseline:
            return None
        return self.ours / self.baseline

    def as_dict(self) -> dict:
        return {"section": self.section, "name": self.name, "unit": self.unit, "ours": self.ours,
                "baseline": self.baseline, "ratio": self.ratio, "runs": list(self.runs),
                "baseline_runs": list(self.baseline_runs), "note": self.note, "work": self.work}


def seconds(action: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def alternate(sides: dict[str, Callable[[], object]], repetitions: int, warm_up: bool = False) -> dict[str, list]:
    """Run every side once per repetition, starting each repetition with the next side, so that a slow spell of
    the machine is shared out; returns each side's measurements in order. `warm_up`: run every side once first,
    unmeasured (imports, caches, the allocator's first requests)."""
    names = list(sides)
    for name in names if warm_up else ():
        sides[name]()
    measured: dict[str, list] = {name: [] for name in names}
    for repetition in range(repetitions):
        shift = repetition % len(names)
        for name in names[shift:] + names[:shift]:
            measured[name].append(sides[name]())
    return measured


def format_table(rows: list[Row]) -> str:
    """One line a row: medians, with the range of the runs beside them when there are several."""
    header = ("section", "measurement", "ours (min-max)", "baseline (min-max)", "unit", "ratio", "runs", "note")
    lines = [header]
    for row in rows:
        lines.append((
            row.section, row.name, _spread(row.runs), _spread(row.baseline_runs) if row.baseline_runs else "-",
            row.unit, "-" if row.ratio is None else f"{row.ratio:.2f}", str(len(row.runs)), row.note,
        ))
    widths = [max(len(line[column]) for line in lines) for column in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths)) + "  " + line[-1] for line in lines
    )


def _spread(runs: tuple[float, ...]) -> str:
    middle = _number(statistics.median(runs))
    return middle if len(runs) == 1 else f"{middle} ({_number(min(runs))}-{_number(max(runs))})"


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
