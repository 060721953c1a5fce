"""MLflow tracking for a training run: rank 0 alone logs the params, the metrics of every epoch and the model.

Where to: the tracking URI of the environment (`databricks` on a cluster, or MLFLOW_TRACKING_URI), unless the
settings name one (tests and `train --local` use a local file store, `file:...`). A resumed run continues the MLflow
run it started (its id is kept in the checkpoints), so one training is one MLflow run however often it restarts.

MLflow is optional: without it the run says so once and trains on, untracked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TrackingSettings:
    experiment: str  # an experiment name, or a workspace path on Databricks (/Users/<you>/<name>)
    tracking_uri: str | None = None  # None: MLflow's own choice from the environment
    register_as: str | None = None  # also register the model under this Unity Catalog name (catalog.schema.model)
    # Set in the logging process before MLflow starts: what a worker process needs to reach the tracking server.
    environment: dict[str, str] = field(default_factory=dict, repr=False)


class Tracker:
    """What the loop calls; every method does nothing on ranks other than 0, or without MLflow."""

    def __init__(self, settings: TrackingSettings | None, is_main: bool, log=print):
        self.settings, self.log = settings, log
        if settings is not None and is_main:
            # Before MLflow is imported: it may read them at import time.
            os.environ.update(settings.environment)
            if is_file_store(settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "databricks")):
                os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses a folder of runs unless told
        self.mlflow = _import_mlflow(log) if settings is not None and is_main else None
        self.run_id: str | None = None

    @property
    def active(self) -> bool:
        return self.mlflow is not None

    def start(self, params: dict, resumed_run_id: str | None) -> str | None:
        """Open the run (or reopen the one a checkpoint names) and log the params; the run id, or None."""
        if not self.active:
            return None
        mlflow, settings = self.mlflow, self.settings
        if settings.tracking_uri:
            mlflow.set_tracking_uri(settings.tracking_uri)
        if resumed_run_id:
            run = mlflow.start_run(run_id=resumed_run_id)
        else:
            mlflow.set_experiment(settings.experiment)
            run = mlflow.start_run()
            mlflow.log_params(params)
        self.run_id = run.info.run_id
        self.log(f"MLflow: run {self.run_id} in experiment {settings.experiment!r} at {mlflow.get_tracking_uri()}")
        return self.run_id

    def log_epoch(self, epoch: int, scores: dict) -> None:
        if self.active:
            self.mlflow.log_metrics({name: float(value) for name, value in scores.items() if name != "epoch"},
                                    step=epoch)

    def log_file(self, path: str) -> None:
        if self.active:
            self.mlflow.log_artifact(path)

    def log_folder(self, path: str, name: str) -> None:
        """A whole folder (a saved Spark ML pipeline) as artifacts of the run, under `name`."""
        if self.active:
            self.mlflow.log_artifacts(path, name)

    def log_dict(self, content: dict, name: str) -> None:
        if self.active:
            self.mlflow.log_dict(content, name)

    def log_model(self, model, example_features) -> None:
        """The trained model, taking raw features to fares, with an input example (and its signature)."""
        if not self.active:
            return
        registered = self.settings.register_as
        if registered and (self.mlflow.get_tracking_uri() or "").startswith("databricks"):
            self.mlflow.set_registry_uri("databricks-uc")
        info = self.mlflow.pytorch.log_model(
            model, name="model", input_example=example_features, serialization_format="pickle",
            registered_model_name=registered,
        )
        self.log(f"MLflow: model logged as {info.model_uri}" + (f", registered as {registered}" if registered else ""))

    def finish(self, succeeded: bool) -> None:
        if self.active and self.mlflow.active_run() is not None:
            self.mlflow.end_run(status="FINISHED" if succeeded else "FAILED")


def is_file_store(uri: str) -> bool:
    """A folder (`./mlruns`, `/tmp/runs`, `file:...`), not a server (`databricks`, `http://...`, `sqlite:///...`):
    a user who names one wants it, as MLflow 2 allowed."""
    if uri == "databricks":
        return False
    scheme, separator, _ = uri.partition(":")
    return not separator or scheme == "file" or len(scheme) == 1  # one letter: a Windows drive


def _import_mlflow(log):
    try:
        import mlflow
        import mlflow.pytorch  # noqa: F401 (the model flavour, loaded with it so that a missing part shows here)
    except ImportError as error:
        log(f"MLflow is not installed ({error}): training continues without tracking. Install mlflow-skinny "
            "(it is part of Databricks Runtime ML) to record params, metrics and the model")
        return None
    return mlflow
