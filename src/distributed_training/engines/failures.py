"""A rank's failure, recorded in a shared folder for the driver's one line (distributors do not say why one failed)."""

import glob
import os
import shutil
import sys
import traceback
from typing import Callable

from ..files import write_text

FAILURES_DIR, ECHO = "failures", "collective-"  # under the output folder, which every rank reaches; an echo's prefix


def run_recording_failure(train_function, failures_dir: str, *args, exit_quietly: bool = False):
    """`exit_quietly`: an expected failure (ours, a ValueError) or an echo exits without its traceback."""
    try:
        return train_function(*args)
    except Exception as error:
        rank = os.environ.get("RANK", "0")
        # met inside torch.distributed (gloo's "connection closed"): most likely a peer's failure echoed
        echo = f"{os.sep}torch{os.sep}distributed{os.sep}" in traceback.extract_tb(error.__traceback__)[-1].filename
        write_text(os.path.join(failures_dir, f"{ECHO if echo else ''}rank-{rank}.txt"),
                   f"rank {rank}: {type(error).__name__}: {error}")
        ours = type(error).__module__.split(".")[0] == __name__.split(".")[0]
        if exit_quietly and (echo or ours or isinstance(error, ValueError)):
            sys.exit(1)
        raise


def first_failure(failures_dir: str) -> str | None:
    """The failure recorded first, echoes after the others, and how many other ranks failed; None when none was."""
    paths = sorted(glob.glob(os.path.join(failures_dir, "*")),
                   key=lambda path: (os.path.basename(path).startswith(ECHO), os.path.getmtime(path)))
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
