"""The seam between a training task and everything else: what `task.py` must define, and how it is loaded.

A task is a module; the launchers, staging, the loop, checkpoints and tracking know it only through these names:

Spark side (the driver, before any training process starts; pyspark is imported inside these functions, so the
GPU nodes of a serverless task, which have no Spark, can import the module):
    DEFAULT_TABLE                         the table a job trains on when --table is not given
    Options                               a dataclass of the task's own `train` options (each field is --field-name)
    sample_table(spark, seed)             a small DataFrame shaped like DEFAULT_TABLE, for `train --local`
    prepare(table, options)               the table's rows as the columns the ranks read (bad rows dropped)
    statistics(train, options)            JSON statistics of the training split (normalisation, the baseline)

Torch side (every rank; the serverless stage task, which has no torch, never calls these):
    examples(rows, stats, options)        this rank's rows (a pyarrow Table) as a tuple of tensors, one example per
                                          row of dimension 0 (the loop shuffles and slices them into batches)
    build_model(stats, options)           the torch module to train
    loss(model, batch)                    a batch's (a tuple like `examples`) mean loss over what `count` counts
    evaluate(model, batch, stats)         sums over a held-out batch, added up over batches and ranks by the loop
    summarize(sums, stats)                the held-out metrics from those sums: at least held_out_loss and
                                          baseline_loss (the trivial predictor's loss on the same rows)
    exported_model(model, stats, batch)   (the module MLflow logs, an example input for it)

Optional, for a task whose examples hold tokens (the causal LM defines both; the fare task neither):
    count(batch)                          the tokens the batch's loss is the mean over: the loop weighs micro-batches
                                          by it and reports tokens/s (without it: examples, and examples/s)
    flops_per_token(model, options)       the model's training FLOPs per token (forward and backward), for MFU

Optional, for a model of repeated blocks (the causal LM defines it; without it --activation-checkpointing is refused):
    blocks(model)                         the submodules (a transformer's blocks) that --activation-checkpointing
                                          recomputes in the backward pass and --compile compiles one by one
    tokenize(rows, options)               (Spark side) a batch of prepared rows (pandas) as one 1-D numpy array of
                                          token ids in the dtype to stage (uint16). Staging runs it on the executors,
                                          once; `examples` then gets the rank's token ids, memory-mapped, not rows

Optional, for `score` (both built-in tasks define them):
    SCORES                                the Spark DDL of the columns `score` adds, e.g. "predicted_fare double"
    score(model, rows, stats, options)    (torch, in Spark's Python workers) a batch of prepared rows (pandas) as a
                                          dict of those columns, one value per row (the model on its device, eval)
    prepare(table, options, keep)         and prepare carries the columns `keep` (score's row number) unchanged

The loop owns the rest: optimizer, LR schedule, gradient clipping, precision, parallelism, checkpoints and MLflow."""

import dataclasses
import importlib
import traceback
from types import ModuleType

REQUIRED = ("DEFAULT_TABLE", "Options", "sample_table", "prepare", "statistics", "examples", "build_model", "loss",
            "evaluate", "summarize", "exported_model")
REQUIRED_METRICS = ("held_out_loss", "baseline_loss")


class TaskError(ValueError):
    """The task module cannot be used: it is missing or does not import, lacks a name, or breaks the seam's contract."""


def load_task(module_name: str) -> ModuleType:
    try:
        task = importlib.import_module(module_name)
    except Exception as error:  # not there, or its own code fails: one line that says where and why
        if isinstance(error, ModuleNotFoundError) and f"{module_name}.".startswith(f"{error.name}."):
            raise TaskError(f"no task module {module_name!r}: pass --task with an importable module that defines "
                            f"{', '.join(REQUIRED)} (see task_interface.py)") from None
        raise TaskError(f"the task module {module_name} does not import: {failed_at(error, module_name)}: fix it "
                        f"(python -c 'import {module_name}' shows the whole traceback)") from None
    if missing := [name for name in REQUIRED if not hasattr(task, name)]:
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
