"""Checkpoints at epoch boundaries that a rerun can trust, and the resume from the newest one.

Layout, under a folder every rank reaches (a Unity Catalog volume on a cluster):

    checkpoints/epoch-00003/state.pt          the training state (DeepSpeed: its own files, a shard per rank)
    checkpoints/epoch-00003/complete.json     written last, by rank 0, once every rank has saved

A checkpoint counts only with its completion marker, and every file is written under a temporary name and then
renamed, so a run killed mid-save leaves nothing a resume would take for whole. A checkpoint that is marked
complete but does not load (a truncated or damaged file) is skipped with a warning, and the one before it is used.

The resumed run ends where an uninterrupted one would: the weights and optimizer state come back from the
checkpoint, and everything random depends only on the seed, the rank and the epoch (see `ShuffledBatches`).
"""

from __future__ import annotations

import json
import os
import re
import shutil

from ..files import write_json
from . import distributed

MARKER = "complete.json"
TAG = re.compile(r"^epoch-(\d+)$")


def tag_of(epoch: int) -> str:
    return f"epoch-{epoch:05d}"


def complete_epochs(directory: str) -> list[int]:
    """The epochs with a complete checkpoint, newest first."""
    if not os.path.isdir(directory):
        return []
    epochs = [int(match.group(1)) for match in map(TAG.match, os.listdir(directory))
              if match and os.path.exists(os.path.join(directory, match.group(0), MARKER))]
    return sorted(epochs, reverse=True)


class CheckpointFolderError(OSError):
    """The checkpoint folder cannot be used: found before training, not after the first epoch."""


def _ensure_writable_folder(directory: str) -> None:
    fix = "Give --output-dir a folder this run can write (a Unity Catalog volume on a cluster)"
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CheckpointFolderError(f"cannot keep checkpoints in {directory}: it is a file, not a folder. {fix}, or "
                                    "move the file away")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise CheckpointFolderError(f"cannot create the checkpoint folder {directory}: {error.strerror or error}. "
                                    f"{fix}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise CheckpointFolderError(
            f"cannot write checkpoints into {directory}: no permission. {fix}")


class Checkpoints:
    """Save and resume the training state; `run_identity` must match for a checkpoint to be resumed from."""

    def __init__(self, directory: str, process: distributed.Process, keep: int, run_identity: dict, log=print):
        if keep < 1:
            raise ValueError(f"keep must be at least 1 checkpoint, got {keep}")
        _ensure_writable_folder(directory)
        self.directory, self.process, self.keep, self.run_identity, self.log = (
            directory, process, keep, run_identity, log)

    def save(self, strategy, epoch: int, progress: dict) -> None:
        """Every rank calls it: the strategy writes the state, then rank 0 marks it complete and drops old ones."""
        tag = tag_of(epoch)
        strategy.save(self.directory, tag)
        distributed.barrier(self.process)  # every rank's files are in place before the marker says so
        if self.process.is_main:
            write_json(os.path.join(self.directory, tag, MARKER),
                       {"epoch": epoch, "run_identity": self.run_identity, **progress})
            self._drop_old()
            self.log(f"checkpoint saved: {os.path.join(self.directory, tag)}")
        distributed.barrier(self.process)

    def resume(self, strategy) -> dict | None:
        """Load the newest checkpoint that loads on every rank; its marker (epoch and progress), or None."""
        for epoch in complete_epochs(self.directory):
            tag = tag_of(epoch)
            marker = self._read_marker(tag)
            if marker is not None and marker.get("run_identity") != self.run_identity:
                raise RuntimeError(
                    f"the checkpoint {os.path.join(self.directory, tag)} belongs to another run "
                    f"({marker.get('run_identity')}, this one is {self.run_identity}): give this run its own "
                    "output folder, or turn resuming off (--no-resume) to start over there"
                )
            loaded = marker is not None and self._load(strategy, tag)
            if distributed.min_over_ranks(self.process, int(loaded)) == 1:
                self.log(f"resuming from the checkpoint of epoch {epoch} ({os.path.join(self.directory, tag)})")
                return marker
            self.log(f"warning: the checkpoint of epoch {epoch} does not load on every rank: skipped, "
                     "trying the one before it")
        return None

    def _read_marker(self, tag: str) -> dict | None:
        try:
            with open(os.path.join(self.directory, tag, MARKER)) as file:
                return json.load(file)
        except (OSError, ValueError):
            return None

    def _load(self, strategy, tag: str) -> bool:
        try:
            strategy.load(self.directory, tag)
            return True
        except Exception as error:  # a truncated zip, a bad pickle, a missing shard: all mean "not this one"
            print(f"warning: rank {self.process.rank} cannot load {os.path.join(self.directory, tag)}: "
                  f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}", flush=True)
            return False

    def _drop_old(self) -> None:
        """Keep the newest `keep` complete checkpoints; older ones, complete or not, go."""
        kept = complete_epochs(self.directory)[:self.keep]
        oldest_kept = min(kept)
        for name in os.listdir(self.directory):
            match = TAG.match(name)
            if match and int(match.group(1)) < oldest_kept:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
