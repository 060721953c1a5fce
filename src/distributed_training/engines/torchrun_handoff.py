"""`train --handoff-to-torchrun`: stage and plan a run here, for torchrun to carry out on other machines.

A serverless GPU job has two tasks. The first (serverless CPU compute, with Spark) runs `train` with this option:
it stages the table, builds the training config as the engine would for its distributor, and writes into
OUTPUT_DIR/torchrun/

    config.json   the TrainingConfig (staged data, loop options, DeepSpeed config, MLflow experiment)
    command.sh    torchrun over the shared loop (`training.train_staged --config`), one process per GPU

The second task (`ai_runtime_task`) runs the command on every node. The platform runs a workspace file, so the job
gives the stage task that path with `--command-path` (under the bundle's root path); the config stays in the volume
beside the staged data. The job names both paths before they exist, and the values only known at run time (the
output folder with the target's volume name, the job's parameters) reach the GPU nodes through these two files.
The task's `code_source_path` brings the project's source to every node; the command imports the loop from there.
"""

from __future__ import annotations

import os
import shlex

from ..training.config import TrainingConfig, save_config
from .settings import DEFAULT_LOCAL_PROCESSES, RunSettings

HANDOFF_DIR = "torchrun"
CONFIG_FILE = "config.json"
COMMAND_FILE = "command.sh"
MASTER_PORT = 29500


def hand_off(config: TrainingConfig, settings: RunSettings) -> str:
    """Write the config and the command beside it; the command's path."""
    directory = os.path.join(settings.output_dir, HANDOFF_DIR)
    os.makedirs(directory, exist_ok=True)
    config_path = os.path.join(directory, CONFIG_FILE)
    save_config(config, config_path)
    processes_per_node = settings.gpus_per_node or settings.processes or DEFAULT_LOCAL_PROCESSES
    command_path = settings.command_path or os.path.join(directory, COMMAND_FILE)
    os.makedirs(os.path.dirname(command_path), exist_ok=True)
    _write_atomically(command_path, command_script(config_path, processes_per_node, settings.num_nodes,
                                                   config.use_gpu))
    os.chmod(command_path, 0o755)
    print(f"\nStaged for torchrun ({settings.engine}'s loop, {processes_per_node} process(es) per node on "
          f"{settings.num_nodes} node(s)):\n  config   {config_path}\n  command  {command_path}")
    return command_path


def command_script(config_path: str, processes_per_node: int, nodes: int, use_gpu: bool) -> str:
    package = __name__.split(".")[0]  # the generated project's own package name
    torchrun = ["python", "-m", "torch.distributed.run", "--nproc-per-node", str(processes_per_node)]
    if nodes == 1:
        torchrun += ["--standalone"]
        rendezvous = ""
    else:
        # Every node runs this script; torchrun's static rendezvous needs each node's rank and the first node's
        # address, which the platform gives each node as the usual environment variables.
        torchrun += ["--nnodes", str(nodes), "--node-rank", '"$NODE_RANK"', "--master-addr", '"$MASTER_ADDR"',
                     "--master-port", '"${MASTER_PORT:-%d}"' % MASTER_PORT]
        rendezvous = (
            'for name in NODE_RANK MASTER_ADDR; do\n'
            '  if [ -z "${!name:-}" ]; then\n'
            f'    echo "error: $name is not set: this {nodes}-node run needs each node\'s rank (NODE_RANK) and the '
            'first node\'s address (MASTER_ADDR) from the platform" >&2\n'
            '    exit 2\n'
            '  fi\n'
            'done\n'
        )
    environment = (
        # The platform unpacks the task's code_source_path on each node and names it CODE_SOURCE_PATH: that copy of
        # the project's code comes first; the wheel in the environment brings the dependencies.
        'export PYTHONPATH="${CODE_SOURCE_PATH:+$CODE_SOURCE_PATH:}${PYTHONPATH:-}"\n'
        + ("" if use_gpu else "export DS_ACCELERATOR=cpu  # CPU processes: DeepSpeed must not look for CUDA\n")
    )
    loop = ["-m", f"{package}.training.train_staged", "--config", shlex.quote(config_path)]
    return (
        "#!/usr/bin/env bash\n"
        "# Written by `train --handoff-to-torchrun`: the shared training loop under torchrun, one process per GPU.\n"
        "set -euo pipefail\n"
        f"{environment}{rendezvous}"
        f"exec {' '.join(torchrun + loop)}\n"
    )


def _write_atomically(path: str, text: str) -> None:
    """A node that starts while a retry rewrites the file reads the old or the new one, never half of it."""
    partial = path + ".partial"
    with open(partial, "w") as file:
        file.write(text)
    os.replace(partial, path)
