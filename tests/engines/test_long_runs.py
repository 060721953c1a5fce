"""A run counted in steps, as a long GPU run is: a step budget, checkpoints every N steps, and a progress report
every N steps (loss, learning rate, gradient norm, tokens/s, MFU where it is known, the step's time) in the output
and in MLflow, with the global step as MLflow's step; the run's totals in metrics.json. The command is the one a
user types, `train --local` on the language model, under TorchDistributor with 2 CPU processes."""

from __future__ import annotations

import re

import pytest

from distributed_training.training.checkpoints import complete_steps, tag_of

from conftest import LANGUAGE, metrics_of, output_of, train_command

pytestmark = pytest.mark.engine

PROGRESS = re.compile(r"^step +(\d+)/12 +epoch 1 +loss ([\d.]+) +lr ([\d.e+-]+) +grad norm ([\d.]+) +([\d,]+) tokens/s "
                      r"+([\d,]+) ms a step \(([\d.]+)% waiting for data\) +(\d+):(\d\d):(\d\d) left$", re.MULTILINE)


def test_a_run_of_twelve_steps_reports_every_three_and_checkpoints_every_five(tmp_path, monkeypatch):
    output = tmp_path / "run"
    completed = train_command(output, "torch_distributor", LANGUAGE, "--model-size", "tiny", "--max-steps", "12",
                              "--checkpoint-every-steps", "5", "--log-every-steps", "3", "--keep-checkpoints", "5")
    assert completed.returncode == 0, output_of(completed)
    noise = ("log4j profile", "NativeCodeLoader", "Setting default log level", "Setting OMP_NUM_THREADS",
             "Saving pytorch model by Pickle")  # lines a user can do nothing about
    lines = (completed.stdout + completed.stderr).splitlines()
    assert not [line for line in lines if any(words in line for words in noise)]

    reports = PROGRESS.findall(completed.stdout)
    assert [int(report[0]) for report in reports] == [3, 6, 9, 12], completed.stdout[-3000:]
    assert all(float(report[4].replace(",", "")) > 0 for report in reports)  # tokens/s
    assert reports[-1][7:] == ("0", "00", "00")  # no time left after the last step
    assert complete_steps(str(output / "checkpoints")) == [12, 10, 5]

    metrics = metrics_of(output)
    assert metrics["step"] == 12 and metrics["tokens_per_second"] > 0 and metrics["mfu"] is None  # no GPU, no MFU
    assert metrics["step_seconds"] > 0 and 0 <= metrics["data_wait_share"] < 1
    assert metrics["epochs"][-1]["step"] == 12 and metrics["epochs"][-1]["epoch"] == 1  # a part of one epoch
    learning_rate = 3e-3  # the default: the last update's rate is the schedule's floor, a tenth
    assert metrics["final"]["learning_rate"] == pytest.approx(learning_rate / 10)
    # the reported losses are the mean over each window's tokens: they agree with the epoch's mean over all of them
    losses = [float(report[1]) for report in reports]
    assert sum(losses) / 4 == pytest.approx(metrics["final"]["train_loss"], rel=1e-3)

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"file:{output / 'mlruns'}")
    run = client.get_run(metrics["mlflow_run_id"])
    assert run.data.params["max_steps"] == "12"
    for name in ("train_loss", "learning_rate", "grad_norm", "tokens_per_second", "step_seconds", "data_wait_share"):
        history = client.get_metric_history(run.info.run_id, name)  # one point a report: the epoch's have their names
        assert sorted(point.step for point in history) == [3, 6, 9, 12], name
    assert not client.get_metric_history(run.info.run_id, "mfu")  # unknown on CPU: not logged as a number
    held_out = client.get_metric_history(run.info.run_id, "held_out_loss")
    assert [point.step for point in held_out] == [12] and held_out[0].value == pytest.approx(metrics["held_out_loss"])
    assert (output / "checkpoints" / tag_of(12) / "rng-rank1.pt").exists()  # each rank's generators
