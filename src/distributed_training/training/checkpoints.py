"""Checkpoints after any optimizer step that a rerun can trust, and the resume from the newest one: step-NNNNNNNN/
holds state.pt (DeepSpeed's files, FSDP2's shards), each rank's random generators (rng-rankR.pt), and, written last by
rank 0 once all ranks saved, complete.json (step, run identity, progress). Only a checkpoint marked complete counts,
and one that does not load is skipped with a warning. A resumed run ends where an uninterrupted one would, even
mid-epoch; it needs the checkpoint's run identity: what changes the math or the data order, not logging or length."""

import json
import os
import random
import re
import shutil

from dataclasses import asdict

from ..config import CHECKPOINTS_DIR
from ..files import write_atomically, write_json
from ..run_folder import finished_metrics

MARKER = "complete.json"
TAG = re.compile(r"^step-(\d+)$")
RNG_FILE = "rng-rank{rank}.pt"


def tag_of(step: int) -> str:
    return f"step-{step:08d}"


def step_of(tag: str) -> int:
    return int(TAG.match(tag).group(1))


def read_marker(directory: str, tag: str) -> dict | None:
    try:
        with open(os.path.join(directory, tag, MARKER)) as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def named_checkpoint(path: str) -> tuple[str, str]:
    """(checkpoints folder, tag) of --init-from's path: a checkpoint, or the newest in a checkpoints or run folder."""
    path = os.path.abspath(path)
    if TAG.match(os.path.basename(path)) and os.path.exists(os.path.join(path, MARKER)):
        return os.path.dirname(path), os.path.basename(path)
    for directory in (path, os.path.join(path, CHECKPOINTS_DIR)):
        if steps := complete_steps(directory):
            return directory, tag_of(steps[0])
    raise CheckpointFolderError(f"--init-from {path} holds no complete checkpoint (step-NNNNNNNN with {MARKER}): "
                                f"give an earlier run's output folder, its {CHECKPOINTS_DIR} folder or a checkpoint")


def _differences(theirs, ours: dict) -> str:
    if not isinstance(theirs, dict):
        return "it records no run identity"
    return "; ".join(f"{name}: {theirs.get(name)!r} -> {ours.get(name)!r}" for name in sorted({*theirs, *ours})
                     if theirs.get(name) != ours.get(name))


def complete_steps(directory: str) -> list[int]:
    """The steps with a complete checkpoint, newest first."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted((int(match.group(1)) for match in map(TAG.match, names)
                   if match and os.path.exists(os.path.join(directory, match.group(0), MARKER))), reverse=True)


def options_identity(config) -> dict:
    """The part of a run's identity that its options decide (JSON types: compared after a round trip)."""
    # the optimizer's settings too: a resume with another schedule or floor would go on along a schedule neither run
    # has, and one with other betas would not even get them (the optimizer's saved state brings the old ones back)
    return {"task": config.task, "task_options": json.loads(json.dumps(asdict(config.task_options))),
            "engine": config.engine, "parallelism": config.parallelism, "seed": config.seed,
            "batch_size": config.batch_size, "grad_accumulation": config.grad_accumulation,
            "learning_rate": config.learning_rate, "weight_decay": config.weight_decay,
            "adam_betas": list(config.adam_betas), "warmup_fraction": config.warmup_fraction,
            "lr_schedule": config.lr_schedule, "min_lr_ratio": config.min_lr_ratio, "grad_clip": config.grad_clip}


def refusal_to_resume(config) -> str | None:
    """Why this run cannot resume its folder's newest checkpoint, or start from --init-from's, as far as the config and
    the markers tell (the source and processes where known; the rows once staged); None when it can."""
    steps = complete_steps(config.checkpoint_dir) if config.resume else []
    if config.init_from and not steps:
        try:
            directory, tag = named_checkpoint(config.init_from)
        except CheckpointFolderError as error:
            return str(error)
        task = ((read_marker(directory, tag) or {}).get("run_identity") or {}).get("task", config.task)
        return None if task == config.task else (
            f"--init-from {os.path.join(directory, tag)} is a checkpoint of the task {task}, not {config.task}: give "
            f"a checkpoint of a {config.task} run, or train that task (--task {task})")
    marker = read_marker(config.checkpoint_dir, tag_of(steps[0])) if steps else None
    if marker is None:
        return None
    theirs, ours = marker.get("run_identity"), options_identity(config)
    if config.table:
        ours["source"] = config.table
    if config.local or config.processes or config.gpus_per_node is not None:  # else the driver's GPUs decide
        ours["world_size"] = config.placement.world_size
    theirs = {name: theirs.get(name) for name in ours} if isinstance(theirs, dict) else theirs
    if differences := _differences(theirs, ours):
        return (f"{config.output_dir} holds the checkpoints of another run ({differences}): give this run its own "
                "--output-dir (--init-from that folder starts it from those weights), train with that run's settings "
                "to continue it, or --no-resume to start over there")
    if config.max_steps and config.max_steps < marker.get("step", 0) and finished_metrics(
            config.output_dir, config.engine, config.task, config.epochs, config.max_steps) is None:
        return (f"--max-steps {config.max_steps} is below the {marker['step']} steps the run in {config.output_dir} "
                "took already: give a larger --max-steps, or a new --output-dir")


class DamagedCheckpoint(ValueError):
    def __init__(self, path: str, problem: str):
        directory, tag = os.path.split(path if TAG.match(os.path.basename(path)) else os.path.dirname(path))
        earlier = [os.path.join(directory, tag_of(step)) for step in complete_steps(directory) if step < step_of(tag)]
        super().__init__(f"{path} {problem}: " + (f"take the checkpoint before it, {earlier[0]}" if earlier else
                                                  "no complete checkpoint comes before it: start fresh"))


def read_checkpoint_file(path: str, read=None, **load_options):
    import torch

    try:
        return read(path) if read else torch.load(path, **load_options)
    except Exception as error:
        raise DamagedCheckpoint(path, "is missing" if not os.path.exists(path) else "is empty" if not
                                os.path.getsize(path) else "is cut short or overwritten") from error


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
        raise CheckpointFolderError(f"cannot write checkpoints into {directory}: no permission. {fix}")


class Checkpoints:
    def __init__(self, directory: str, process, keep: int, run_identity: dict, log=print, every=(1, None)):
        _ensure_writable_folder(directory)
        self.directory, self.process, self.keep, self.run_identity, self.log = (
            directory, process, keep, run_identity, log)
        self.every_epochs, self.every_steps = every  # --checkpoint-every, --checkpoint-every-steps

    def due(self, step: int, plan) -> bool:  # the run's last step always
        epoch_ended = plan.ends_epoch(step) and plan.epoch_of(step - 1) % self.every_epochs == 0
        return step == plan.updates or epoch_ended or bool(self.every_steps and step % self.every_steps == 0)

    def save(self, strategy, step: int, progress: dict) -> None:
        """Every rank calls it: each saves its part, then rank 0 marks it complete (with `progress`), drops old ones."""
        import torch  # here, not above: the pre-check runs where there is no torch (a serverless stage task)

        from . import ranks

        tag = tag_of(step)
        strategy.save(self.directory, tag)
        write_atomically(os.path.join(self.directory, tag, RNG_FILE.format(rank=self.process.rank)),
                         lambda file: torch.save(random_states(), file))
        ranks.barrier(self.process)  # every rank's files are in place before the marker says so
        if self.process.is_main:
            write_json(os.path.join(self.directory, tag, MARKER),
                       {"step": step, "run_identity": self.run_identity, **progress})
            self._drop_old()
            self.log(f"checkpoint saved: {os.path.join(self.directory, tag)}")
        ranks.barrier(self.process)

    def resume(self, strategy) -> dict | None:
        """Load this run's newest checkpoint that loads on every rank; its marker (step and progress), or None."""
        fix = "give this run its own output folder, or turn resuming off (--no-resume) to start over there"
        return self._load_newest(strategy, self.directory, complete_steps(self.directory), "resuming from", fix)

    def continue_from(self, strategy, directory: str, tag: str) -> dict:
        """--init-from PATH --init-mode full: load an earlier run's checkpoint, whole, into this new run."""
        fix = "start from its weights alone (--init-mode weights), or train with the settings that run had"
        marker = self._load_newest(strategy, directory, [step_of(tag)], f"--init-from {directory}: starting from", fix)
        if marker is None:
            raise DamagedCheckpoint(os.path.join(directory, tag), "does not load on every rank (the warnings above "
                                    "say why), so --init-from cannot start from it")
        return marker

    def _load_newest(self, strategy, directory: str, steps: list[int], doing: str, fix: str) -> dict | None:
        from . import ranks

        for step in steps:
            tag = tag_of(step)
            marker = read_marker(directory, tag)
            if marker is not None and marker.get("run_identity") != self.run_identity:
                raise RuntimeError(f"the checkpoint {os.path.join(directory, tag)} belongs to another run "
                                   f"({_differences(marker.get('run_identity'), self.run_identity)}): {fix}")
            loaded = marker is not None and self._load(strategy, directory, tag)
            if ranks.min_over_ranks(self.process, int(loaded)) == 1:
                self.log(f"{doing} the checkpoint of step {step} ({os.path.join(directory, tag)})")
                return marker
            self.log(f"warning: the checkpoint of step {step} does not load on every rank: skipped, "
                     "trying the one before it")
        return None

    def _load(self, strategy, directory: str, tag: str) -> bool:
        try:
            strategy.load(directory, tag)
            generators = os.path.join(directory, tag, RNG_FILE.format(rank=self.process.rank))
            if os.path.exists(generators):  # a checkpoint of another world size has none for this rank
                restore_random_states(generators)
            return True
        except Exception as error:  # a truncated zip, a bad pickle, a missing shard: all mean "not this one"
            why = str(error) if isinstance(error, DamagedCheckpoint) else (
                f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}")
            print(f"warning: rank {self.process.rank} cannot load {os.path.join(directory, tag)}: {why}", flush=True)
            return False

    def _drop_old(self) -> None:
        """Keep the newest `keep` complete checkpoints; older ones, complete or not, go."""
        oldest_kept = min(complete_steps(self.directory)[:self.keep])
        for name in os.listdir(self.directory):
            match = TAG.match(name)
            if match and int(match.group(1)) < oldest_kept:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)


def random_states() -> dict:
    import numpy
    import torch

    states = {"python": random.getstate(), "numpy": numpy.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def restore_random_states(path: str) -> None:
    import numpy
    import torch

    states = read_checkpoint_file(path, weights_only=False)  # Python's and numpy's states are tuples of plain values
    random.setstate(states["python"])
    numpy.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])

