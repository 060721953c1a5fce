"""The seam between a training task and everything else: what `task.py` must define, and how it is loaded.

A task is a module. The launchers, the staging, the loop, checkpoints and tracking know it only through these names,
in the order a run uses them:

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
    loss(model, batch)                    the mean training loss of a batch (a tuple like `examples` returns), the
                                          mean over what `count` counts
    evaluate(model, batch, stats)         sums over a held-out batch, added up over batches and ranks by the loop
    summarize(sums, stats)                the held-out metrics from those sums: at least held_out_loss and
                                          baseline_loss (the trivial predictor's loss on the same rows)
    exported_model(model, stats, batch)   (the module MLflow logs, an example input for it)

Optional, for a task whose examples hold tokens (the causal LM defines both; the fare task neither):
    count(batch)                          the tokens the batch's loss is the mean over. The loop weighs each
                                          micro-batch by it, so an update's gradient is that of the mean over every
                                          token of the update on every rank, and reports tokens/s. Without it the
                                          loop counts examples (rows of dimension 0) and reports examples/s.
    flops_per_token(model, options)       the model's training FLOPs per token (forward and backward), for MFU

Optional, for a model of repeated blocks (the causal LM defines it; without it --activation-checkpointing is refused):
    blocks(model)                         the submodules (a transformer's blocks) that --activation-checkpointing
                                          recomputes in the backward pass and --compile compiles one by one
    tokenize(rows, options)               (Spark side) a batch of prepared rows (pandas) as one 1-D numpy array of
                                          token ids in the dtype to stage (uint16). Staging runs it on the executors,
                                          once; `examples` then gets the rank's token ids, memory-mapped, not rows

The loop owns everything else: the optimizer, the learning-rate schedule, gradient clipping, precision, data
parallelism, checkpoints and MLflow.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

REQUIRED = ("DEFAULT_TABLE", "Options", "sample_table", "prepare", "statistics", "examples", "build_model", "loss",
            "evaluate", "summarize", "exported_model")
REQUIRED_METRICS = ("held_out_loss", "baseline_loss")


class TaskError(ValueError):
    """The task module cannot be used: it is missing, or lacks a name the seam needs."""


def load_task(module_name: str) -> ModuleType:
    """Import the task module and check that it defines every name of the seam."""
    try:
        task = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            raise TaskError(f"no task module {module_name!r}: pass --task with an importable module that defines "
                            f"{', '.join(REQUIRED)} (see task_interface.py)") from None
        raise
    missing = [name for name in REQUIRED if not hasattr(task, name)]
    if missing:
        raise TaskError(f"the task module {module_name} lacks {', '.join(missing)}: a task defines "
                        f"{', '.join(REQUIRED)} (see task_interface.py)")
    if not dataclasses.is_dataclass(task.Options):
        raise TaskError(f"{module_name}.Options must be a dataclass of the task's options")
    return task


def check_metrics(metrics: dict, module_name: str) -> dict:
    missing = [name for name in REQUIRED_METRICS if name not in metrics]
    if missing:
        raise TaskError(f"{module_name}.summarize returned no {', '.join(missing)}: every task states its held-out "
                        "loss next to the trivial predictor's loss on the same rows")
    return metrics
