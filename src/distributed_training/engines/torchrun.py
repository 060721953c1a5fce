"""The shared loop under torchrun, on GPU nodes that have no Spark."""
# Planned here (`train --handoff-to-torchrun`), carried out by `python -m <package>.engines.torchrun --config FILE`:
# torchrun over this module's --worker. A serverless GPU job's `stage` task (Spark, no torch) runs `train --engine E
# --handoff-to-torchrun --job-run-id {{job.run_id}}`: it stages the table into the job run's folder, writes the run's
# config there and names it in the MLflow experiment as `torchrun_config.<job run id>`. Its `train` task, an
# `ai_runtime_task`, runs `src/command.sh`, hence this module, on every node: the AI Runtime passes no parameters and
# deploys the files once for all runs, but gives each attempt its own MLflow run (MLFLOW_RUN_ID), linked to its job
# run; so a node asks which job run left a config, and two runs (or a repair after a later run) never take each other's.

import argparse
import contextlib
import json
import os
import shlex
import sys

from ..config import Config, from_json, to_json
from ..data.staging import stage
from ..files import write_json, write_text
from ..run_folder import FolderInUse, announce_finished, held
from ..task_interface import load_task
from ..training.checkpoints import refusal_to_resume
from . import LaunchError, failures

HANDOFF_DIR, CONFIG_FILE, COMMAND_FILE = "torchrun", "config.json", "command.sh"
CONFIG_TAG = "torchrun_config"
KEPT_CONFIGS = 50  # the job runs whose configs the experiment keeps naming: the newest, for repairs
MASTER_PORT = "29400"
MODULE = f"{__package__}.torchrun"  # this module by name: run as `-m`, its __name__ is __main__


def hand_off(spark, config: Config, environment: dict[str, str]) -> str:
    where = config.placement
    stage(spark, load_task(config.task), config, where.world_size)
    directory = os.path.join(config.output_dir, HANDOFF_DIR)
    config_path, command_path = os.path.join(directory, CONFIG_FILE), os.path.join(directory, COMMAND_FILE)
    write_json(config_path, to_json(config))
    write_text(command_path, "#!/usr/bin/env bash\n# Written by `train --handoff-to-torchrun`: the run of config.json "
               f"under torchrun.\nexec {shlex.quote(sys.executable)} -m {MODULE} --config "
               f"{shlex.quote(config_path)}\n", mode=0o755)
    if not config.local and config.tracking:
        _publish(config, config_path, environment)
    print(f"\nStaged for torchrun ({config.engine}'s loop, {where.describe()}):\n  config   {config_path}\n"
          f"  command  {command_path}", flush=True)
    return config_path


def _publish(config: Config, config_path: str, environment: dict[str, str]) -> None:
    from ..training.tracking import experiment_name

    os.environ.update(environment)
    try:
        import mlflow
    except ImportError:
        raise LaunchError("the stage task names the run's config in MLflow for the GPU task, but mlflow does not "
                          "import here: add mlflow-skinny to the stage task's environment") from None
    client = mlflow.MlflowClient()
    experiment = mlflow.set_experiment(experiment_name(config))
    client.set_experiment_tag(experiment.experiment_id, config_tag(config.job_run_id), config_path)
    for job_run in configs_by_job_run(client.get_experiment(experiment.experiment_id).tags)[KEPT_CONFIGS:]:
        client.delete_experiment_tag(experiment.experiment_id, config_tag(job_run))
    print(f"MLflow: experiment {experiment.name} names it ({config_tag(config.job_run_id)})", flush=True)


def config_tag(job_run_id: str) -> str:
    return f"{CONFIG_TAG}.{job_run_id}"


def configs_by_job_run(tags: dict[str, str]) -> list[str]:
    runs = [tag[len(CONFIG_TAG) + 1:] for tag in tags if tag.startswith(CONFIG_TAG + ".")]
    return sorted(runs, key=lambda run: (len(run), run), reverse=True)


def config_of_platform_run() -> str:
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        raise LaunchError("no --config was given and MLFLOW_RUN_ID is not set: on a serverless GPU task the platform "
                          "opens the task's MLflow run; elsewhere pass --config OUTPUT_DIR/torchrun/config.json")
    import mlflow

    client = mlflow.MlflowClient()
    experiment = client.get_experiment(client.get_run(run_id).info.experiment_id)
    job_runs = configs_by_job_run(experiment.tags)
    if not job_runs:
        raise LaunchError(f"the experiment {experiment.name} names no run config ({CONFIG_TAG}.<job run id>): the "
                          "stage task (`train --handoff-to-torchrun --job-run-id {{job.run_id}}`) writes it; check "
                          "that it ran with the same --mlflow-experiment as this task's experiment")
    return experiment.tags[config_tag(job_run_of(run_id, job_runs))]


def job_run_of(mlflow_run_id: str, job_runs: list[str]) -> str:
    """Which of `job_runs` runs MLflow run `mlflow_run_id`'s GPU task (SDK retries and timeouts bound each request)."""
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.errors import DatabricksError

    api = WorkspaceClient().api_client
    for job_run in job_runs:
        try:
            tasks = api.do("GET", "/api/2.2/jobs/runs/get", query={"run_id": job_run}).get("tasks", [])
        except DatabricksError as error:
            if "does not exist" in str(error):  # a run deleted since: not this one
                continue
            raise LaunchError(f"the Jobs API refused to show job run {job_run} ({str(error).splitlines()[0]}): the "
                              "GPU task's identity needs CAN VIEW on its own job") from None
        for task in (task for task in tasks if "ai_runtime_task" in task):
            output = api.do("GET", "/api/2.2/jobs/runs/get-output", query={"run_id": task["run_id"]})
            if output.get("ai_runtime_task_output", {}).get("mlflow_run_id") == mlflow_run_id:
                return job_run
    raise LaunchError(f"none of the job runs whose stage task named a config ({', '.join(job_runs)}) runs the MLflow "
                      f"run {mlflow_run_id}: its stage task did not run, or it ran more than {KEPT_CONFIGS} job runs "
                      "ago; repair the job run with its stage task")


def torchrun_command(config: Config, config_path: str) -> list[str]:
    where = config.placement
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(where.processes_per_node)]
    if where.nodes == 1:
        command.append("--standalone")
    else:
        missing = [name for name in ("NODE_RANK", "MASTER_ADDR") if not os.environ.get(name)]
        if missing:
            raise LaunchError(f"{', '.join(missing)} not set: this {where.nodes}-node run needs each node's rank "
                              "(NODE_RANK) and the first node's address (MASTER_ADDR) from the platform")
        command += ["--nnodes", str(where.nodes), "--node-rank", os.environ["NODE_RANK"], "--master-addr",
                    os.environ["MASTER_ADDR"], "--master-port", os.environ.get("MASTER_PORT", MASTER_PORT)]
    return [*command, "-m", MODULE, "--worker", "--config", config_path]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--config", metavar="FILE", help="the run's config (default: the one its MLflow run names)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # what torchrun starts
    args = parser.parse_args(argv)
    try:
        path = args.config or config_of_platform_run()
        with open(path) as file:
            config = from_json(json.load(file), path)
        command = None if args.worker else torchrun_command(config, path)
    except (LaunchError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.worker:
        from ..training import ranks
        from ..training.loop import train

        # its results are written and its process group closed when it returns; a failure recorded for the parent
        failures.run_recording_failure(train, failures.folder(config.output_dir), config, exit_quietly=True)
        ranks.leave_now()  # past the native teardown, where a finished gloo rank was seen to abort
    if announce_finished(config):
        return 0
    if refusal := refusal_to_resume(config):
        print(f"error: {refusal}", file=sys.stderr)
        return 1
    first_node = os.environ.get("NODE_RANK", "0") == "0"  # it holds the folder for the run
    try:
        with held(config.output_dir, inheritable=True) if first_node else contextlib.nullcontext():
            if not config.placement.use_gpu and config.engine == "deepspeed":
                from .deepspeed import build_cpu_communication_op

                os.environ["DS_ACCELERATOR"] = "cpu"  # CPU processes: DeepSpeed must not look for CUDA
                build_cpu_communication_op()  # a LaunchError when it does not build
            print("+ " + shlex.join(command), flush=True)
            from torch.distributed.run import parse_args, run  # torchrun's main, here: its failure becomes one line

            failures.reported(lambda: run(parse_args(command[3:])), config.output_dir, config.placement.describe())
    except (FolderInUse, LaunchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
