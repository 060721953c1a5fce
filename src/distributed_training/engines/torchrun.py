"""The shared loop under torchrun: plan a run here (`train --handoff-to-torchrun`), carry it out on GPU nodes that
have no Spark (`python -m <package>.engines.torchrun`).

A serverless GPU job has two tasks. `stage` (serverless compute with Spark, no torch) runs `train --engine E
--handoff-to-torchrun`: it stages the table into the target's volume, writes the run's config beside it
(OUTPUT_DIR/torchrun/config.json) and names that file in the MLflow experiment the GPU task logs to (the experiment's
tag `torchrun_config`). `train`, an `ai_runtime_task`, runs the project's `src/command.sh` on every node, which runs
this module: it reads the config that the experiment of the platform's MLflow run (MLFLOW_RUN_ID) names, and starts
torchrun with a process per GPU. The platform passes the command no parameters, and the target's volume (its name
holds the deploying user's in dev) is only known at run time: the experiment is what both tasks share.

With --local, and anywhere else, the config file is given: `train --handoff-to-torchrun` also writes
OUTPUT_DIR/torchrun/command.sh, which runs `python -m <package>.engines.torchrun --config OUTPUT_DIR/torchrun/
config.json`. torchrun then runs this module again with --worker in each process, which trains.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from ..config import Config, from_json, placement, to_json
from ..files import write_json, write_text
from ..staging import stage
from ..task_interface import load_task
from . import LaunchError

HANDOFF_DIR, CONFIG_FILE, COMMAND_FILE = "torchrun", "config.json", "command.sh"
CONFIG_TAG = "torchrun_config"
MASTER_PORT = "29400"
MODULE = f"{__package__}.torchrun"  # this module by name: run as `-m`, its __name__ is __main__


def hand_off(spark, config: Config, environment: dict[str, str]) -> str:
    """Stage for the planned processes and write the config and a command beside it; the config's path."""
    where = placement(config)
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
    """Name the config in the MLflow experiment that the GPU task's run belongs to."""
    from ..training.tracking import experiment_name

    os.environ.update(environment)
    try:
        import mlflow
    except ImportError:
        raise LaunchError("the stage task names the run's config in MLflow for the GPU task, but mlflow does not "
                          "import here: add mlflow-skinny to the stage task's environment") from None
    experiment = mlflow.set_experiment(experiment_name(config))
    mlflow.MlflowClient().set_experiment_tag(experiment.experiment_id, CONFIG_TAG, config_path)
    print(f"MLflow: experiment {experiment.name} names it ({CONFIG_TAG})", flush=True)


def config_of_platform_run() -> str:
    """The config that the experiment of the platform's MLflow run names (a serverless GPU task's nodes)."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        raise LaunchError("no --config was given and MLFLOW_RUN_ID is not set: on a serverless GPU task the platform "
                          "opens the task's MLflow run; elsewhere pass --config OUTPUT_DIR/torchrun/config.json")
    import mlflow

    client = mlflow.MlflowClient()
    experiment = client.get_experiment(client.get_run(run_id).info.experiment_id)
    if CONFIG_TAG not in experiment.tags:
        raise LaunchError(f"the experiment {experiment.name} names no run config ({CONFIG_TAG}): the stage task "
                          "(`train --handoff-to-torchrun`) writes it; check that it ran with the same "
                          "--mlflow-experiment as this task's experiment")
    return experiment.tags[CONFIG_TAG]


def torchrun_command(config: Config, config_path: str) -> list[str]:
    """torchrun over this module's --worker: a process per GPU (or CPU process) on each node. Several nodes meet
    at the first one, whose address and each node's rank the platform sets as NODE_RANK and MASTER_ADDR."""
    where = placement(config)
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
    parser.add_argument("--config", metavar="FILE", help="the run's config, as `train --handoff-to-torchrun` wrote it "
                        "(default: the one the platform's MLflow run names)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # what torchrun starts
    args = parser.parse_args(argv)
    try:
        path = args.config or config_of_platform_run()
        with open(path) as file:
            config = from_json(json.load(file), path)
        if not args.worker:
            command = torchrun_command(config, path)
    except (LaunchError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.worker:
        from ..training.loop import train

        train(config)
        return 0
    if not placement(config).use_gpu and config.engine == "deepspeed":
        from .deepspeed import build_cpu_communication_op

        os.environ["DS_ACCELERATOR"] = "cpu"  # CPU processes: DeepSpeed must not look for CUDA
        try:
            build_cpu_communication_op()
        except LaunchError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    print("+ " + shlex.join(command), flush=True)
    os.execv(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
