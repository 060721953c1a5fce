"""A worker's failure, brought back to the driver as one line: distributors stream the workers' output but not why one
failed (TorchDistributor says only that training failed), so each rank records its exception in a shared folder."""

import os
import shutil
from typing import Callable

FAILURES_DIR = "failures"  # under the output folder, which every rank reaches


def run_recording_failure(train_function, failures_dir: str, *args):
    try:
        return train_function(*args)
    except Exception as error:
        os.makedirs(failures_dir, exist_ok=True)
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(failures_dir, f"rank-{rank}.txt"), "w") as file:
            file.write(f"rank {rank}: {type(error).__name__}: {error}")
        raise


def first_failure(failures_dir: str) -> str | None:
    """The failure recorded first, and how many other ranks failed after it; None when none was recorded."""
    names = os.listdir(failures_dir) if os.path.isdir(failures_dir) else []
    paths = sorted((os.path.join(failures_dir, name) for name in names), key=os.path.getmtime)
    if not paths:
        return None
    with open(paths[0]) as file:
        first = file.read().strip()
    return first + (f" (and {len(paths) - 1} more rank(s) failed after it)" if len(paths) > 1 else "")


def folder(output_dir: str) -> str:
    return os.path.join(output_dir, FAILURES_DIR)


def reported(start: Callable, output_dir: str, description: str):
    """Run `start()`, a distributor whose ranks record failures: one comes back as a LaunchError naming the first."""
    from . import LaunchError

    shutil.rmtree(folder(output_dir), ignore_errors=True)
    try:
        return start()
    except Exception as error:  # a distributor raises RuntimeError, a barrier stage a Py4J or Spark error
        reason = first_failure(folder(output_dir)) or (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise LaunchError(f"training failed in the worker processes ({description}): {reason}. Their output is "
                          "above") from None
