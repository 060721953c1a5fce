"""Stage the data in Spark and build the training config, for the engines that run the torch loop on every rank."""

from __future__ import annotations

import os

from ..training.config import TrainingConfig
from ..training.staging import stage_training_data
from . import run_options
from .settings import LaunchError, RunSettings

STAGING_DIR = "staging"


def stage_and_configure(spark, settings: RunSettings, world_size: int, use_gpu: bool) -> TrainingConfig:
    """Stage the training table under output_dir/staging for `world_size` ranks; the config every rank gets."""
    try:
        staged = stage_training_data(spark, settings.table, os.path.join(settings.output_dir, STAGING_DIR),
                                     world_size=world_size, seed=settings.seed)
    except ValueError as error:  # the table is unreadable, lacks columns or is too small: the message says which
        raise LaunchError(str(error)) from None
    return TrainingConfig(
        data=staged,
        output_dir=settings.output_dir,
        epochs=settings.epochs,
        batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
        seed=settings.seed,
        use_gpu=use_gpu,
        precision=run_options.precision(settings, use_gpu),
        grad_accumulation=settings.grad_accumulation,
        checkpoint_every=settings.checkpoint_every,
        keep_checkpoints=settings.keep_checkpoints,
        resume=settings.resume,
        tracking=run_options.tracking(settings),
    )
