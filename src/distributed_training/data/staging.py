"""Stage the training data with Spark (no torch): the task's rows, split, its statistics, a parquet file per process."""
# In a folder every rank sees. A rerun reuses what the same task, options, seed, processes and source (`fingerprint`)
# staged; a changed source is staged again, or refused where checkpoints would resume on it.

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import time
import uuid
from contextlib import suppress

from ..config import STAGING_DIR, Config
from ..run_folder import METRICS_FILE, FolderInUse, held
from ..training.checkpoints import complete_steps
from .staged import MANIFEST, StagedData

TEST_FRACTION = 0.2
HELD_OUT, HASH_BUCKETS = "_held_out", 10_000  # a prepared row's side of the split, by a hash of it into buckets
ROWS_DIR = "rows"  # the prepared rows with their side, while they are staged
TOKENS_A_ROW = 1 << 16  # staged token streams are cut into rows of this many ids, so that row groups stay small:
ROW_GROUP_BYTES = 4 << 20  # a rank copying its tokens to its local disk holds about one row group at a time


class TableError(ValueError):
    """The training table cannot be read, or the task cannot use it: the message says which and what to do."""


def looks_like_path(source: str) -> bool:
    return "/" in source or ":" in source or source.endswith(".parquet")


def read_table(spark, source: str, default_table: str):
    try:
        table = spark.read.parquet(source) if looks_like_path(source) else spark.table(source)
        table.columns  # noqa: B018 (resolves the table, so a missing one fails here)
    except spark_errors() as error:  # no such table; a file that is not parquet (the cause names it)
        kind = "parquet path" if looks_like_path(source) else "table"
        raise TableError(f"cannot read the {kind} {source!r}: {cause(error)}. Pass --table with an existing table "
                         f"(catalog.schema.table, default {default_table}) or a path of parquet files") from None
    return table


def spark_errors() -> tuple[type, ...]:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    return PySparkException, Py4JJavaError


def cause(error: Exception) -> str:
    """The innermost Java cause's first line (it names the file), else the message's (a Python worker's: its last)."""
    java = getattr(error, "java_exception", None)
    while java is not None and java.getCause() is not None:
        java = java.getCause()
    text = str(error if java is None else java.getMessage() or java.toString()).strip() or type(error).__name__
    return text.splitlines()[-1 if "Traceback (most recent call last)" in text else 0]


def held_out(prepared, seed: int):
    """A seeded hash of a prepared row: the same rows however the table is read, identical rows on one side."""
    from pyspark.sql import functions as F

    columns = [column(name) for name in prepared.columns]
    return F.pmod(F.xxhash64(F.lit(seed), *columns), F.lit(HASH_BUCKETS)) < round(TEST_FRACTION * HASH_BUCKETS)


def column(name: str):
    """The column of that name, whatever its characters (a dot would name a struct's field)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def split(prepared, seed: int):
    """The seeded train/held-out split; every engine splits with it, so all are scored on the same held-out rows."""
    rule = held_out(prepared, seed)
    return prepared.where(~rule), prepared.where(rule)


def fingerprint(spark, source: str, table) -> dict:
    """A Delta table's version; else its files' names, sizes and write times (a rewrite in place keeps the names)."""
    from pyspark.errors import PySparkException

    if not looks_like_path(source):
        try:
            return {"of": f"Delta version {spark.sql(f'DESCRIBE HISTORY {source} LIMIT 1').first()['version']}"}
        except PySparkException:  # not a Delta table
            pass
    files = sorted(table.inputFiles())
    seen = [os.stat(path) if os.path.isfile(path) else None for path in
            (re.sub(r"^(file|dbfs):/*", "/", name) for name in files)]
    listing = "\n".join(f"{name} {file.st_size} {file.st_mtime_ns}" if file else name
                        for name, file in zip(files, seen))
    newest = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(max((file.st_mtime for file in seen if file), default=0)))
    return {"of": f"{len(files)} file(s), {sum(file.st_size for file in seen if file):,} bytes, last written {newest} "
                  f"UTC, listing {hashlib.sha256(listing.encode()).hexdigest()[:16]}"}


def stage(spark, task, config: Config, world_size: int) -> StagedData:
    table = read_table(spark, config.table, task.DEFAULT_TABLE)
    recipe = json.loads(json.dumps({
        "task": config.task, "task_options": dataclasses.asdict(config.task_options), "seed": config.seed,
        "source": config.table, "files_per_split": world_size, "fingerprint": fingerprint(spark, config.table, table)}))
    try:
        before = StagedData.load(config.staging_dir)
    except (OSError, ValueError, TypeError):  # none, damaged, or from an older version: staged again
        before = None
    if before and before.recipe == recipe and os.path.isdir(before.train_dir):  # (removed once the run was old)
        print(f"using the data staged at {config.staging_dir}: {config.table} is as it was staged "
              f"({recipe['fingerprint']['of']})", flush=True)
        check_windows(task, config, before.train_rows, world_size)
        return before
    changed = before and before.recipe.get("source") == config.table and before.recipe.get("fingerprint")
    if changed and changed != recipe["fingerprint"] and config.resume and complete_steps(config.checkpoint_dir):
        raise TableError(f"{config.table} changed since this run staged it ({changed['of']} then, "
                         f"{recipe['fingerprint']['of']} now), and the run's checkpoints were trained on the data "
                         "as it was: resuming would train on other data. Start a new run (a new job run, or another "
                         "--output-dir) to train on the table as it is, or --no-resume to start this one over")
    try:
        prepared = task.prepare(table, config.task_options)
    except ValueError as error:  # the task says why the table does not fit it
        raise TableError(f"{config.table!r}: {error}") from None
    rows_dir = os.path.join(config.staging_dir, ROWS_DIR)
    try:
        # One pass prepares and splits the rows into the staging folder; what follows reads them back. Not cache():
        # serverless compute refuses it (Databricks docs, "Serverless compute limitations").
        labelled = prepared.withColumn(HELD_OUT, held_out(prepared, config.seed))
        labelled.write.mode("overwrite").partitionBy(HELD_OUT).parquet(rows_dir)
        written = spark.read.schema(labelled.schema).parquet(rows_dir)
        train, test = (written.where(side).drop(HELD_OUT) for side in (~written[HELD_OUT], written[HELD_OUT]))
        train_rows, test_rows = train.count(), test.count()
        if train_rows < world_size:
            raise TableError(f"{config.table!r} leaves {train_rows} training row(s) after preparation, fewer than the "
                             f"{world_size} processes: train on a larger table")
        if test_rows == 0:
            raise TableError(f"{config.table!r} leaves no held-out rows after preparation: train on a larger table")
        check_windows(task, config, train_rows, world_size)
        staged = StagedData(directory=config.staging_dir, task=config.task, source=config.table,
                            train_rows=train_rows, test_rows=test_rows, files_per_split=world_size,
                            stats=task.statistics(train, config.task_options), recipe=recipe,
                            token_dtype=str(task.tokenize(train.limit(1).toPandas(), config.task_options).dtype)
                            if task.tokenizes else None, staging_id=uuid.uuid4().hex)
        if before:  # the old manifest goes first: a staging cut short leaves none, so nothing uses half-written data
            os.unlink(os.path.join(config.staging_dir, MANIFEST))
        for rows, directory in ((train, staged.train_dir), (test, staged.test_dir)):
            rows = rows.repartition(world_size)
            if task.tokenizes:
                rows = tokenized(rows, task.tokenize, config.task_options)
            rows.write.mode("overwrite").option("parquet.block.size", ROW_GROUP_BYTES).parquet(directory)
    except spark_errors() as error:  # what the task's preparation or Spark's reading or writing of the rows met
        raise TableError(f"staging {config.table!r} failed: {cause(error)}: fix what that names (the table's data, "
                         f"or the staging folder {config.staging_dir}), then run again") from None
    finally:
        shutil.rmtree(rows_dir, ignore_errors=True)
        with suppress(OSError):  # a first staging refused leaves no folder
            os.rmdir(config.staging_dir)
    staged.save()
    remove_old_staging(config.output_dir, config.keep_staged_days)
    return staged


def check_windows(task, config: Config, train_rows: int, world_size: int) -> None:
    batches = math.ceil(train_rows // world_size / config.batch_size)
    if not task.tokenizes and batches < config.grad_accumulation:
        raise TableError(f"{config.table!r} leaves {train_rows} training row(s): {batches} batch(es) of "
                         f"{config.batch_size} an epoch for each of {world_size} processes, fewer than one window of "
                         f"--grad-accumulation {config.grad_accumulation}: lower it or --batch-size, or add rows")


def tokenized(rows, tokenize, options):
    """The rows as token streams, made on the executors: rows of TOKENS_A_ROW ids (bytes), order and partitions kept."""
    def streams(batches):
        import pandas as pd

        for batch in batches:
            tokens = tokenize(batch, options)
            yield pd.DataFrame({"tokens": [tokens[start:start + TOKENS_A_ROW].tobytes()
                                           for start in range(0, len(tokens), TOKENS_A_ROW)]})

    return rows.mapInPandas(streams, "tokens binary")


def remove_old_staging(output_dir: str, keep_days: int) -> None:
    """Remove the staged rows (not the manifest, which score reads) of the runs beside this one that finished over
    `keep_days` ago (0: none), not of one that has not (a retry resumes on them) or that trains now (held)."""
    parent, cutoff = os.path.dirname(output_dir.rstrip("/")), time.time() - keep_days * 86_400
    for name in sorted(os.listdir(parent)) if keep_days else ():
        run = os.path.join(parent, name)
        try:
            finished = os.stat(os.path.join(run, METRICS_FILE)).st_mtime
            staged = StagedData.load(os.path.join(run, STAGING_DIR))
        except (OSError, ValueError, TypeError):  # not finished, or no run's staging
            continue
        if finished < cutoff and run != output_dir and os.path.isdir(staged.train_dir):
            with suppress(FolderInUse), held(run):  # FolderInUse: it trains again now (continued further)
                for directory in (staged.train_dir, staged.test_dir):
                    shutil.rmtree(directory, ignore_errors=True)
                print(f"removed the staged rows of {run}, finished over {keep_days} day(s) ago", flush=True)
