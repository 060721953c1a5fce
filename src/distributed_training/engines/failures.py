"""Bring a worker's failure back to the driver as one line.

Distributors stream the workers' output to the driver but do not say why a worker failed (TorchDistributor reports
only that training failed). Each rank therefore records its exception in a shared folder before it dies, and the
launcher reports the earliest one: the others are usually its echo (peers losing their connection).
"""

from __future__ import annotations

import os
import shutil


def run_recording_failure(train_function, failures_dir: str, *args):
    """Call train_function(*args); on an exception, write it to failures_dir/rank-N.txt and re-raise."""
    try:
        return train_function(*args)
    except Exception as error:
        os.makedirs(failures_dir, exist_ok=True)
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(failures_dir, f"rank-{rank}.txt"), "w") as file:
            file.write(f"rank {rank}: {type(error).__name__}: {error}")
        raise


def clear(failures_dir: str) -> None:
    shutil.rmtree(failures_dir, ignore_errors=True)


def first_failure(failures_dir: str) -> str | None:
    """The failure recorded first, and how many other ranks failed after it; None when none was recorded."""
    if not os.path.isdir(failures_dir):
        return None
    paths = sorted((os.path.join(failures_dir, name) for name in os.listdir(failures_dir)), key=os.path.getmtime)
    if not paths:
        return None
    with open(paths[0]) as file:
        first = file.read().strip()
    return first + (f" (and {len(paths) - 1} more rank(s) failed after it)" if len(paths) > 1 else "")
