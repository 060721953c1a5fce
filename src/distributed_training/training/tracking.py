"""MLflow tracking for a training run: rank 0 alone logs the params, the metrics (every --log-every-steps and every
epoch, at the global step) and the model; without MLflow the run says so once and trains on, untracked."""

import importlib.metadata
import logging
import os

from ..config import Config

WORKSPACE_PREFIX = "/Workspace/"


def experiment_name(config: Config) -> str:
    """--mlflow-experiment, else one per project: a workspace path on a cluster, a plain name in a file store. Without
    the `/Workspace` prefix of `${workspace.root_path}`: `set_experiment` with it creates the experiment once and fails
    on every later call (mlflow/mlflow#11077, terraform-provider-databricks#4601)."""
    package = __package__.split(".")[0]
    name = config.mlflow_experiment or (package if config.local else f"/Shared/{package}")
    return "/" + name[len(WORKSPACE_PREFIX):] if name.startswith(WORKSPACE_PREFIX) else name


def tracking_uri(config: Config) -> str | None:
    if config.local and not os.environ.get("MLFLOW_TRACKING_URI"):
        return "file:" + os.path.join(config.output_dir, "mlruns")
    return None  # MLflow's own choice from the environment


def is_file_store(uri: str) -> bool:
    """A folder (`./mlruns`, `/tmp/runs`, `file:...`), not a server (`databricks`, `http://...`, `sqlite:///...`)."""
    if uri == "databricks":
        return False
    scheme, separator, _ = uri.partition(":")
    return not separator or scheme == "file" or len(scheme) == 1  # one letter: a Windows drive


class Tracker:
    """What the loop calls; every method does nothing on ranks other than 0, or without MLflow."""

    def __init__(self, config: Config, is_main: bool, environment: dict[str, str], log=print):
        self.config, self.log, self.mlflow = config, log, None
        self.owns_tracking_uri = False  # whether start() set the tracking URI, which finish() undoes
        if config.tracking and is_main:
            os.environ.update(environment)  # before MLflow is imported: it may read them at import time
            if is_file_store(tracking_uri(config) or os.environ.get("MLFLOW_TRACKING_URI", "databricks")):
                os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses a folder of runs unless told
            # Metrics go out in batches, a second's worth a call; and a flush takes what is queued at once, where
            # MLflow's unbuffered thread only looks every second (a second lost to each flush, while the ranks wait).
            os.environ.setdefault("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", "1")
            try:
                import mlflow
                import mlflow.pytorch  # noqa: F401 (the model flavour, loaded now so that a missing part shows here)
            except ImportError as error:
                log(f"MLflow is not installed ({error}): training continues without tracking. Install mlflow-skinny "
                    "(it is part of Databricks Runtime ML) to record params, metrics and the model")
            else:
                self.mlflow = mlflow
                logging.getLogger("mlflow.pytorch").addFilter(not_the_pickle_notice)

    def start(self, params: dict, resumed_run_id: str | None) -> str | None:
        """Open the run (the one a checkpoint names, or the platform's, or a new one); the run id, or None."""
        if not self.mlflow:
            return None
        mlflow = self.mlflow
        if tracking_uri(self.config):
            # set_tracking_uri also exports MLFLOW_TRACKING_URI: undone in finish(), or a later run in this process
            # (a notebook, a test) would take this run's folder for the user's choice
            self.owns_tracking_uri = True
            mlflow.set_tracking_uri(tracking_uri(self.config))
        platform_run = os.environ.get("MLFLOW_RUN_ID")  # a serverless GPU task's: each attempt gets its own
        run = self._reopened(resumed_run_id) if resumed_run_id and not platform_run else None
        if run is None:
            if not platform_run:  # start_run() takes the platform's run from it
                mlflow.set_experiment(experiment_name(self.config))
            run = mlflow.start_run()
            mlflow.log_params(params)
            if self.config.job_run_id:
                mlflow.set_tag("job_run_id", self.config.job_run_id)  # the platform's job run that trained it
        self.log(f"MLflow: run {run.info.run_id} in experiment {run.info.experiment_id} at {mlflow.get_tracking_uri()}")
        return run.info.run_id

    def _reopened(self, run_id: str):
        """The checkpoint's MLflow run, open again; None where the store cannot give it back: deleted, or a local
        folder's record that a kill cut short mid-write (MLflow rewrites meta.yaml in place), where MLflow raises its
        own errors or a bare AttributeError. Tracking never stops the training: a new run takes the metrics on."""
        try:
            return self.mlflow.start_run(run_id=run_id)
        except Exception as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            self.log(f"MLflow cannot reopen run {run_id}, where this run's checkpoint was tracked ({reason}): its "
                     "metrics from here on go to a new MLflow run")
            return None

    def log_step(self, step: int, figures: dict) -> None:
        """Numbers at the global step (MLflow's step axis), not waited for: a call to a workspace takes tens of ms."""
        if self.mlflow:
            numbers = {name: float(value) for name, value in figures.items()
                       if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}
            self.mlflow.log_metrics(numbers, step=step, synchronous=False)

    def log_file(self, path: str) -> None:
        if self.mlflow:
            self._flush()
            self.mlflow.log_artifact(path)

    def log_folder(self, path: str, name: str) -> None:
        if self.mlflow:
            self._flush()
            self.mlflow.log_artifacts(path, name)

    # What log_step left to the background, written: logging an artifact or a model reads the run back, and a local
    # file store fails on a metric file still being written ("Metric ... is malformed").
    def _flush(self) -> None:
        self.mlflow.flush_async_logging()

    def log_model(self, model, example_input) -> None:
        """The trained model as the task exports it, with an input example (and so a signature)."""
        if not self.mlflow:
            return
        self._flush()
        registered = self.config.register_model
        if registered and (self.mlflow.get_tracking_uri() or "").startswith("databricks"):
            self.mlflow.set_registry_uri("databricks-uc")
        info = self.mlflow.pytorch.log_model(model, name="model", input_example=example_input,
                                             serialization_format="pickle", registered_model_name=registered,
                                             pip_requirements=model_requirements(model))
        self.log(f"MLflow: model logged as {info.model_uri}" + (f", registered as {registered}" if registered else ""))

    def finish(self, succeeded: bool) -> None:
        if self.mlflow:
            self._flush()  # before the run ends
        if self.mlflow and self.mlflow.active_run() is not None:
            self.mlflow.end_run(status="FINISHED" if succeeded else "FAILED")
        if self.owns_tracking_uri:
            self.mlflow.set_tracking_uri(None)
            self.owns_tracking_uri = False


# mlflow.pytorch's notice, in every run off Databricks, that a pickled model runs code as it loads: the model is pickled
# on purpose (it loads back as the task's module, for any batch size, where the pt2 format's exported program is traced
# for the input example's shapes), and it is loaded from the run's own store.
def not_the_pickle_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Saving pytorch model by Pickle or CloudPickle")


def model_requirements(model) -> list[str]:
    """The distributions that loading the pickled model imports, pinned: torch, the pickler, and the installed ones that
    define the model's modules. MLflow would infer them by loading the model in a subprocess: seconds the ranks wait."""
    providers = importlib.metadata.packages_distributions()
    names = {"torch", "cloudpickle", "numpy"}
    names.update(*(providers.get(type(module).__module__.partition(".")[0], ()) for module in model.modules()))
    return [f"{name}=={importlib.metadata.version(name).partition('+')[0]}" for name in sorted(names)]
