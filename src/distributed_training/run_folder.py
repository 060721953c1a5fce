"""A run's folder (--output-dir): what one run owns, held while it trains, and whether it has finished. A job run's is
its own (`<volume>/<engine>/<job run id>`): a retry or repair resumes there, a new run starts fresh; a run into a
finished run's folder reports its metrics and ends, so a repair that reruns a finished task changes nothing."""

import errno
import fcntl
import json
import os
import time
from contextlib import contextmanager

LOCK_FILE = ".train.lock"
METRICS_FILE = "metrics.json"
MODEL_FILE = "model.pt"  # the torch loop's final weights (a state dict), which `score` loads
HF_MODEL_DIR = "hf_model"  # the trained model in Hugging Face format, where the task saves it (`save_pretrained`)


class FolderInUse(ValueError):
    """Another run holds the folder, or it cannot be written: the message names the fix."""


@contextmanager
def held(path: str, inheritable: bool = False):
    """The run's folder, created, writable and held: a second run into it is refused at once; the kernel's lock leaves
    nothing stuck after a crash. `inheritable`: the lock passes to a program this process execs (torchrun)."""
    try:
        os.makedirs(path, exist_ok=True)
        lock = open(os.path.join(path, LOCK_FILE), "a+")
    except OSError as error:
        raise FolderInUse(f"cannot write into --output-dir {path}: {error.strerror or error}. Give a folder this run "
                          "can create and write (a Unity Catalog volume path on a cluster)") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise FolderInUse(f"{path} is in use by another training run ({holder}): wait for it to end, or give this "
                              "run its own --output-dir") from None
        except OSError as error:  # a file system without locks (some network mounts): go on unguarded
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {os.uname().nodename}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        lock.flush()
        os.set_inheritable(lock.fileno(), inheritable)
        yield


def announce_finished(config) -> bool:
    """Whether the run in config.output_dir has finished (a resumable run only); says so, with its result."""
    finished = finished_metrics(config.output_dir, config.engine, config.task, config.epochs, config.max_steps) \
        if config.resume else None
    if finished is not None:
        print(f"The run in {config.output_dir} has finished already: held-out loss {finished['held_out_loss']:.4f}, "
              f"the trivial predictor's {finished['baseline_loss']:.4f} ({finished.get('metrics_file')}). Nothing to "
              "train: to train again, give a new --output-dir, or --no-resume to start over there.", flush=True)
    return finished is not None


def finished_metrics(output_dir: str, engine: str, task: str, epochs: int, max_steps: int | None = None) -> dict | None:
    """The metrics of the run finished in `output_dir` with this engine and task, for at least the steps `epochs` and
    `max_steps` make; None if none (no metrics yet, another engine or task, or fewer steps: a longer run continues)."""
    try:
        with open(os.path.join(output_dir, METRICS_FILE)) as file:
            metrics = json.load(file)
    except (OSError, ValueError):
        return None
    if not isinstance(metrics, dict) or metrics.get("engine") != engine or metrics.get("task", task) != task:
        return None
    if "step" not in metrics:  # Spark ML fits once: no steps
        return metrics
    done, per_epoch = metrics.get("step"), metrics.get("updates_per_epoch")
    if not (isinstance(done, int) and isinstance(per_epoch, int)):
        return None
    return metrics if done >= min(epochs * per_epoch, max_steps or epochs * per_epoch) else None
