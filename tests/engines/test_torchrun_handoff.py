"""The serverless GPU job's two steps, here on CPU: `train --handoff-to-torchrun` stages the table and writes the
run's config and command, then that command (what the `ai_runtime_task` runs on every node) trains under torchrun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_training.engines.torchrun_handoff import command_script

SOURCE = Path(__file__).resolve().parents[2] / "src"
BETTER_THAN_THE_MEAN = 3.0


def environment(**extra):
    """This interpreter first on PATH (the command runs `python`), the checkout's package importable."""
    return {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")])), **extra}


@pytest.mark.engine
@pytest.mark.parametrize("engine", ["torch_distributor", "deepspeed"])
def test_the_serverless_command_trains_what_the_stage_step_planned(tmp_path, engine):
    """As in the job: the config goes beside the staged data, the command to the (workspace) path the GPU task runs."""
    output = tmp_path / "run"
    command = tmp_path / "workspace" / ".bundle" / "torchrun" / engine / "command.sh"
    staged = subprocess.run(
        [sys.executable, "-m", "distributed_training", "train", "--engine", engine, "--local", "--handoff-to-torchrun",
         "--output-dir", str(output), "--command-path", str(command), "--epochs", "3"],
        capture_output=True, text=True, env=environment(), timeout=300,
    )
    assert staged.returncode == 0, staged.stdout[-3000:] + staged.stderr[-3000:]
    assert f"command  {command}" in staged.stdout
    assert not (output / "metrics.json").exists(), "the stage step must not train"

    assert not (output / "torchrun" / "command.sh").exists()
    trained = subprocess.run(["bash", str(command)], cwd=tmp_path, capture_output=True, text=True,
                             env=environment(), timeout=300)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    metrics = json.loads((output / "metrics.json").read_text())
    losses = [epoch["train_loss"] for epoch in metrics["epochs"]]
    assert metrics["world_size"] == 2 and len(losses) == 3 and losses[-1] < losses[0], losses
    assert metrics["final"]["test_rmse"] * BETTER_THAN_THE_MEAN < metrics["final"]["baseline_rmse"]
    assert (output / "checkpoints" / "epoch-00003" / "complete.json").exists()
    config = json.loads((output / "torchrun" / "config.json").read_text())
    assert config["strategy"] == ("deepspeed" if engine == "deepspeed" else "ddp")
    assert config["tracking"]["environment"] == {}  # credentials never land in a file


def test_a_multi_node_command_stops_at_once_without_the_nodes_rank(tmp_path):
    script = tmp_path / "command.sh"
    script.write_text(command_script("/Volumes/c/s/v/run/torchrun/config.json", processes_per_node=8, nodes=2,
                                     use_gpu=True))
    assert "--nnodes 2" in script.read_text() and "--nproc-per-node 8" in script.read_text()
    bare = {name: value for name, value in environment().items() if name not in ("NODE_RANK", "MASTER_ADDR")}
    completed = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=bare, timeout=30)
    assert completed.returncode == 2
    assert "NODE_RANK is not set: this 2-node run needs each node's rank" in completed.stderr


def test_the_command_runs_the_code_the_task_unpacked_before_the_installed_wheel(tmp_path):
    """The platform unpacks code_source_path on each node and names it CODE_SOURCE_PATH: that copy is what runs."""
    code_source = tmp_path / "code_source"
    loop = code_source / "distributed_training" / "training"
    loop.mkdir(parents=True)
    for package in (loop.parent, loop):
        (package / "__init__.py").write_text("")
    (loop / "train_staged.py").write_text(
        "import os, sys\n"
        "open(os.path.join(os.environ['MARKER_DIR'], 'rank-' + os.environ['RANK']), 'w').write(sys.argv[-1])\n")
    script = tmp_path / "command.sh"
    script.write_text(command_script("/staged/config.json", processes_per_node=2, nodes=1, use_gpu=False))
    completed = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                               env=environment(CODE_SOURCE_PATH=str(code_source), MARKER_DIR=str(tmp_path)))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert sorted(path.name for path in tmp_path.glob("rank-*")) == ["rank-0", "rank-1"]
    assert (tmp_path / "rank-0").read_text() == "/staged/config.json"
