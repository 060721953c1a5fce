"""The seam between a training task and everything else: what `task.py` defines (`Task`, and the optional parts that
`LoadedTask` gives defaults) and how it is loaded. The loop owns the rest: optimizer, LR schedule, gradient clipping,
precision, parallelism, checkpoints and MLflow."""

import dataclasses
import importlib
import inspect
import traceback
from typing import TYPE_CHECKING, Protocol

from .files import write_folder_atomically


# The names every task module defines: the launchers, staging, the loop, checkpoints and tracking know a task only by
# them and its optional parts. A module follows this Protocol by having them; it need not name it.
class Task(Protocol):
    DEFAULT_TABLE: str  # the table a job trains on when --table is not given
    Options: type  # a dataclass of the task's own `train` options (each field is --field-name)

    # Spark side: the driver, before any training process starts. pyspark is imported inside these functions, so the
    # GPU nodes of a serverless task, which have no Spark, can import the module.
    # A small DataFrame shaped like DEFAULT_TABLE, for `train --local`.
    def sample_table(self, spark, seed: int): ...

    # The table's rows as the columns the ranks read (bad rows dropped). A task that scores takes `keep` too:
    # prepare(table, options, keep) carries those columns (score's row number) unchanged.
    def prepare(self, table, options): ...

    # JSON statistics of the training split (normalisation, the baseline).
    def statistics(self, train, options) -> dict: ...

    # Torch side: every rank (the serverless stage task, which has no torch, never calls these).
    # This rank's rows (a pyarrow Table, or the token ids `tokenize` staged, memory-mapped) as a tuple of tensors, one
    # example per row of dimension 0 (the loop shuffles and slices them into batches).
    def examples(self, rows, stats: dict, options) -> tuple: ...

    # The torch module to train. In a distributed run rank 0 builds it; the other ranks call it under
    # torch.device("meta") and get rank 0's weights, so it builds the structure alone there (from_pretrained refuses
    # the meta device: from_config instead, as tasks/fine_tune.py does).
    def build_model(self, stats: dict, options): ...

    # A batch's (a tuple like `examples`) mean loss over what `count` counts.
    def loss(self, model, batch: tuple): ...

    # Sums over a held-out batch, added up over batches and ranks by the loop.
    def evaluate(self, model, batch: tuple, stats: dict) -> dict: ...

    # The held-out metrics from those sums: at least held_out_loss and baseline_loss (the trivial predictor's loss on
    # the same rows).
    def summarize(self, sums: dict, stats: dict) -> dict: ...

    # (the module MLflow logs, an example input for it)
    def exported_model(self, model, stats: dict, batch: tuple) -> tuple: ...


# Task's names, in its order (the order the errors list them in).
REQUIRED = (*Task.__annotations__, *(name for name, member in vars(Task).items()
                                     if inspect.isfunction(member) and not name.startswith("_")))
REQUIRED_METRICS = ("held_out_loss", "baseline_loss")
# Optional, for `score` (both built-in tasks define them). SCORES: the Spark DDL of the columns `score` adds, e.g.
# "predicted_fare double". score(model, rows, stats, options), torch side in Spark's Python workers: a batch of prepared
# rows (pandas) as a dict of those columns, one value per row (the model on its device, in eval mode).
SCORING = ("SCORES", "score")

if TYPE_CHECKING:  # to a type checker and an IDE a LoadedTask has the Task parts, which __getattr__ finds at run time
    _TaskParts = Task
else:
    _TaskParts = object


class LoadedTask(_TaskParts):
    """A task module: its own names, and each optional part of the seam, the module's or else its default."""

    def __init__(self, module: Task):
        self.module = module
        # Optional, for a task whose examples hold tokens (the causal LM defines count and flops_per_token, the fare
        # task neither). count(batch): the tokens the batch's loss is the mean over; the loop weighs micro-batches by
        # it and reports tokens/s. Without it: the batch's examples, and examples/s.
        self.counts_tokens = hasattr(module, "count")
        # Optional, for a model of repeated blocks (the causal LM's). blocks(model): the submodules (a transformer's
        # blocks) that --activation-checkpointing recomputes in the backward pass and --compile compiles one by one.
        # Without it --activation-checkpointing is refused, and --compile compiles the whole model.
        self.has_blocks = hasattr(module, "blocks")
        # Optional (the causal LM's), Spark side. tokenize(rows, options): a batch of prepared rows (pandas) as one 1-D
        # numpy array of token ids in the dtype to stage (uint16). Staging runs it on the executors, once; `examples`
        # then gets the rank's token ids, memory-mapped, not rows. Without it: staging writes the rows.
        self.tokenizes = hasattr(module, "tokenize")

    def __getattr__(self, name: str):
        if name == "module":  # asked before __init__ set it, as copying and unpickling do
            raise AttributeError(name)
        return getattr(self.module, name)

    def lacks(self, names: tuple[str, ...]) -> list[str]:
        return [name for name in names if not hasattr(self.module, name)]

    def count(self, batch: tuple):
        return self.module.count(batch) if self.counts_tokens else len(batch[0])

    # Optional, with count. flops_per_token(model, options): the model's training FLOPs per token (forward and
    # backward), for MFU. Without it: None, and no MFU.
    def flops_per_token(self, model, options) -> float | None:
        return self.module.flops_per_token(model, options) if hasattr(self.module, "flops_per_token") else None

    def blocks(self, model) -> list:
        return self.module.blocks(model) if self.has_blocks else [model]

    # Optional, for a learning rate per group of parameters (LoRA+ gives the adapters' B matrices a larger one).
    # parameter_groups(model, options): a list of {"params": [...], "lr_scale": float (default 1)}, each group trained
    # at lr_scale times the schedule's rate, together every trainable parameter of `model` (as the strategy holds it:
    # FSDP2's are sharded); weight decay falls on each group's matrices only. Without it: None, one group of them all.
    def parameter_groups(self, model, options) -> list[dict] | None:
        return self.module.parameter_groups(model, options) if hasattr(self.module, "parameter_groups") else None

    # Optional, for a model that serving stacks load in Hugging Face format (the fine-tuning task's), on rank 0 at the
    # run's end. save_pretrained(model, folder, options): the trained model (build_model's, with the final weights)
    # written into `folder`, which it creates. Here the folder is filled beside its place, then renamed into it.
    # Without it: nothing, and no folder.
    def save_pretrained(self, model, folder: str, options) -> None:
        if hasattr(self.module, "save_pretrained"):
            write_folder_atomically(folder, lambda partial: self.module.save_pretrained(model, partial, options))


class TaskError(ValueError):
    """The task module cannot be used: it is missing or does not import, lacks a name, or breaks the seam's contract."""


def load_task(module_name: str) -> LoadedTask:
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # not there, or its own code fails: one line that says where and why
        if isinstance(error, ModuleNotFoundError) and f"{module_name}.".startswith(f"{error.name}."):
            raise TaskError(f"no task module {module_name!r}: pass --task with an importable module that defines "
                            f"{', '.join(REQUIRED)} (see task_interface.py)") from None
        raise TaskError(f"the task module {module_name} does not import: {failed_at(error, module_name)}: fix it "
                        f"(python -c 'import {module_name}' shows the whole traceback)") from None
    task = LoadedTask(module)
    if missing := task.lacks(REQUIRED):
        raise TaskError(f"the task module {module_name} lacks {', '.join(missing)}: a task defines "
                        f"{', '.join(REQUIRED)} (see task_interface.py)")
    if not dataclasses.is_dataclass(task.Options):
        raise TaskError(f"{module_name}.Options must be a dataclass of the task's options")
    return task


def failed_at(error: Exception, module_name: str) -> str:
    """`file, line N: Error: message` of an error importing the module: a syntax error where it is, another error at
    the module's own line that raised it (or led to it), else at the deepest line of Python that did."""
    if isinstance(error, SyntaxError):
        (path, line), message = (error.filename, error.lineno), error.msg
    else:
        frames = [(frame, line) for frame, line in traceback.walk_tb(error.__traceback__)
                  if not frame.f_code.co_filename.startswith("<frozen")]
        own = [(frame, line) for frame, line in frames if frame.f_globals.get("__name__") == module_name]
        frame, line = (own or frames)[-1]
        path, message = frame.f_code.co_filename, str(error)
    return f"{path}, line {line}: {type(error).__name__}: {(message.splitlines() or [''])[0]}"


def check_examples(examples, module_name: str) -> tuple:
    lengths = [len(tensor) for tensor in examples] if isinstance(examples, tuple) else []
    if len(set(lengths)) != 1:
        shape = f"tensors of {' and '.join(map(str, lengths))} rows" if lengths else f"a {type(examples).__name__}"
        raise TaskError(f"{module_name}.examples returned {shape}: return a tuple of tensors with one example per row "
                        "of dimension 0, as many rows in each (see task_interface.py)")
    return examples


def check_metrics(metrics: dict, module_name: str) -> dict:
    if missing := [name for name in REQUIRED_METRICS if name not in metrics]:
        raise TaskError(f"{module_name}.summarize returned no {', '.join(missing)}: every task states its held-out "
                        "loss next to the trivial predictor's loss on the same rows")
    return metrics
