"""Checkpoints at epoch boundaries that a rerun can trust, and the resume from the newest one.

Layout, under a folder every rank reaches (a Unity Catalog volume on a cluster):

    checkpoints/epoch-00003/state.pt          the training state (DeepSpeed: its own files, a shard per rank)
    checkpoints/epoch-00003/complete.json     written last, by rank 0, once every rank has saved

A checkpoint counts only with its completion marker, and every file is written under a temporary name and then
renamed, so a run killed mid-save leaves nothing a resume would take for whole. A checkpoint that is marked
complete but does not load (a truncated or damaged file) is skipped with a warning, and the one before it is used.

A new run may start from another run's checkpoint (--init-from): its weights alone, or with `continue_from` its
whole state, when the run identities match.

The resumed run ends where an uninterrupted one would: the weights and optimizer state come back from the
checkpoint, and everything random depends only on the seed, the rank and the epoch (see `ShuffledBatches`).
"""

from __future__ import annotations

import json
import os
import re
import shutil

from ..config import CHECKPOINTS_DIR
from ..files import write_json
from . import distributed

MARKER = "complete.json"
TAG = re.compile(r"^epoch-(\d+)$")


def tag_of(epoch: int) -> str:
    return f"epoch-{epoch:05d}"


def epoch_of(tag: str) -> int:
    return int(TAG.match(tag).group(1))


def read_marker(directory: str, tag: str) -> dict | None:
    try:
        with open(os.path.join(directory, tag, MARKER)) as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def named_checkpoint(path: str) -> tuple[str, str]:
    """(checkpoints folder, tag) of what --init-from names: one checkpoint (the folder with its completion marker),
    or the newest complete one in a checkpoints folder or in a run's output folder."""
    path = os.path.abspath(path)
    if TAG.match(os.path.basename(path)) and os.path.exists(os.path.join(path, MARKER)):
        return os.path.dirname(path), os.path.basename(path)
    for directory in (path, os.path.join(path, CHECKPOINTS_DIR)):
        epochs = complete_epochs(directory)
        if epochs:
            return directory, tag_of(epochs[0])
    raise CheckpointFolderError(f"--init-from {path} holds no complete checkpoint (a folder epoch-NNNNN with "
                                f"{MARKER}): give an earlier run's output folder, its {CHECKPOINTS_DIR} folder or one "
                                "of its checkpoints")


def _differences(theirs, ours: dict) -> str:
    """What differs between a checkpoint's run identity and this run's, as `name: theirs -> ours`."""
    if not isinstance(theirs, dict):
        return "it records no run identity"
    changed = [f"{name}: {theirs.get(name)!r} -> {ours.get(name)!r}" for name in sorted({*theirs, *ours})
               if theirs.get(name) != ours.get(name)]
    return "; ".join(changed)


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
        """Load this run's newest checkpoint that loads on every rank; its marker (epoch and progress), or None."""
        fix = "give this run its own output folder, or turn resuming off (--no-resume) to start over there"
        return self._load_newest(strategy, self.directory, complete_epochs(self.directory), "resuming from", fix)

    def continue_from(self, strategy, directory: str, tag: str) -> dict:
        """--init-from PATH --init-mode full: load an earlier run's checkpoint, whole, into this new run."""
        fix = "start from its weights alone (--init-mode weights), or train with the settings that run had"
        marker = self._load_newest(strategy, directory, [epoch_of(tag)], f"--init-from {directory}: starting from",
                                   fix)
        if marker is None:
            raise RuntimeError(f"--init-from: the checkpoint {os.path.join(directory, tag)} does not load on every "
                               "rank: give another checkpoint of that run")
        return marker

    def _load_newest(self, strategy, directory: str, epochs: list[int], doing: str, fix: str) -> dict | None:
        for epoch in epochs:
            tag = tag_of(epoch)
            marker = read_marker(directory, tag)
            if marker is not None and marker.get("run_identity") != self.run_identity:
                raise RuntimeError(
                    f"the checkpoint {os.path.join(directory, tag)} belongs to another run "
                    f"({_differences(marker.get('run_identity'), self.run_identity)}): {fix}")
            loaded = marker is not None and self._load(strategy, directory, tag)
            if distributed.min_over_ranks(self.process, int(loaded)) == 1:
                self.log(f"{doing} the checkpoint of epoch {epoch} ({os.path.join(directory, tag)})")
                return marker
            self.log(f"warning: the checkpoint of epoch {epoch} does not load on every rank: skipped, "
                     "trying the one before it")
        return None

    def _load(self, strategy, directory: str, tag: str) -> bool:
        try:
            strategy.load(directory, tag)
            return True
        except Exception as error:  # a truncated zip, a bad pickle, a missing shard: all mean "not this one"
            print(f"warning: rank {self.process.rank} cannot load {os.path.join(directory, tag)}: "
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
