"""The driver's side of the loop's options: precision, MLflow destination and credentials, resolved once.

The worker processes cannot ask the Spark driver anything, so what they need is decided here and travels in the
training config.
"""

from __future__ import annotations

import os

from ..training.tracking import TrackingSettings
from .settings import LaunchError, RunSettings

LOCAL_TRACKING_DIR = "mlruns"
LOCAL_EXPERIMENT = "distributed-training"
CLUSTER_EXPERIMENT = "/Shared/distributed-training"


def precision(settings: RunSettings, use_gpu: bool) -> str:
    """`auto`: bf16 on GPUs that have it (Ampere and newer), fp16 on older ones (T4, V100), fp32 on CPU."""
    if settings.precision != "auto":
        if settings.precision == "fp16" and not use_gpu:
            raise LaunchError("--precision fp16 needs GPUs, but this run trains on CPU: use fp32 (or bf16)")
        return settings.precision
    if not use_gpu:
        return "fp32"
    if settings.handoff_to_torchrun:
        return "bf16"  # every serverless GPU accelerator (A10, H100) has it; this task cannot see them
    import torch

    # The driver is a node of the same type as the workers; one without a GPU cannot tell, and fp16 works on all.
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp16"


def tracking(settings: RunSettings) -> TrackingSettings | None:
    """Where rank 0 logs: the environment's tracking server (Databricks on a cluster) or, with --local and no
    MLFLOW_TRACKING_URI, a file store under the output folder."""
    if not settings.tracking:
        return None
    if settings.local and not os.environ.get("MLFLOW_TRACKING_URI"):
        return TrackingSettings(
            experiment=settings.mlflow_experiment or LOCAL_EXPERIMENT,
            tracking_uri="file:" + os.path.join(settings.output_dir, LOCAL_TRACKING_DIR),
            register_as=settings.register_model,
        )
    return TrackingSettings(
        experiment=settings.mlflow_experiment or (LOCAL_EXPERIMENT if settings.local else CLUSTER_EXPERIMENT),
        register_as=settings.register_model,
        environment=_databricks_credentials() if not settings.local else {},
    )


def _databricks_credentials() -> dict[str, str]:
    """Host and token of the job's context, for worker processes that log to the workspace's MLflow.

    Processes started by a distributor do not inherit the notebook context the driver's MLflow client uses; the
    platform's documented remedy is to hand them DATABRICKS_HOST and DATABRICKS_TOKEN. Empty where there is no
    such context (then MLflow's own environment lookup applies).
    """
    if os.environ.get("DATABRICKS_HOST") and os.environ.get("DATABRICKS_TOKEN"):
        return {}
    try:
        from databricks.sdk.runtime import dbutils

        context = dbutils.notebook.entry_point.getDbutils().notebook().getContext()
        return {"DATABRICKS_HOST": context.apiUrl().get(), "DATABRICKS_TOKEN": context.apiToken().get()}
    except Exception:  # not on Databricks, or no context to ask: nothing to hand over
        return {}
