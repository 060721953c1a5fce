"""`train`'s options: one Config, every number checked while parsing, conflicts refused before Spark starts, the
task's own options on the same command line, and the run's config as a file that reads back the same."""

from __future__ import annotations

import json
import time

import pytest

from distributed_training import config as configuration
from distributed_training.config import Config, ConfigError
from distributed_training.launch import main, output_folder

from support.runs import FARE, LANGUAGE

TRAIN = ["--engine", "torch_distributor", "--task", FARE]


@pytest.mark.parametrize("option, value, words", [
    ("--epochs", "0", "outside 1..100000"),
    ("--epochs", "1e9", "is not a whole number"),
    ("--learning-rate", "inf", "must be a finite number above 0"),
    ("--learning-rate", "nan", "must be a finite number above 0"),
    ("--learning-rate", "-0.1", "must be a finite number above 0"),
    ("--learning-rate", "1e300", "at most 10"),
    ("--batch-size", "٣", None),  # an Arabic-Indic digit: int() takes it; it is a whole number 3, and accepted
    ("--grad-clip", "-1", "at least 0"),
    ("--processes", "0", "outside 1..1024"),
    ("--num-nodes", "257", "outside 1..256"),
    ("--hidden-sizes", "64,0", "outside 1..1000000"),
])
def test_numbers_it_cannot_use_are_usage_errors_while_parsing(option, value, words, capsys):
    argv = [*TRAIN, "--local", option, value]
    if words is None:
        assert configuration.from_args(argv).batch_size == 3
        return
    with pytest.raises(SystemExit) as exit_:
        configuration.from_args(argv)
    assert exit_.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    (["--local", "--num-nodes", "2"], "--local runs on this machine, one node, but --num-nodes is 2"),
    (["--local", "--gpus-per-node", "4"], "--local trains on CPU processes, but --gpus-per-node is 4"),
    ([], "--output-dir is required on a cluster"),
    (["--output-dir", "dbfs:/tmp/run"], "is a URI, but the training processes read the staged data as files"),
    (["--output-dir", "/Volumes/c/s/v/run", "--processes", "2", "--gpus-per-node", "4"],
     "with GPUs there is one per GPU"),
    (["--output-dir", "/tmp/run", "--num-nodes", "2", "--gpus-per-node", "4"],
     "--output-dir /tmp/run is not shared between nodes"),
    (["--output-dir", "/Volumes/c/s/v/run", "--handoff-to-torchrun"],
     "--handoff-to-torchrun plans a run on GPU nodes this task does not see: give --gpus-per-node"),
    (["--local", "--zero-stage", "3"], "--zero-stage configure DeepSpeed, but the engine is torch_distributor"),
    (["--local", "--spark-ml-model", "gbt"], "--spark-ml-model configure Spark ML"),
    (["--local", "--register-model", "c.s.m", "--no-tracking"], "--no-tracking turns MLflow off"),
])
def test_options_that_cannot_work_together_fail_with_one_line_before_spark_starts(options, message, capsys,
                                                                                  tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    started = time.perf_counter()
    assert main([*TRAIN, *options]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1
    assert time.perf_counter() - started < 5  # nothing was started
    assert not (tmp_path / "build").exists()


def test_only_the_torch_loop_is_handed_to_torchrun(capsys):
    assert main(["--engine", "ray", "--task", FARE, "--local", "--handoff-to-torchrun"]) == 2
    error = capsys.readouterr().err
    assert "--handoff-to-torchrun hands the torch loop to torchrun, but ray does not train with it" in error


def test_the_task_s_own_options_are_train_options():
    config = configuration.from_args(["--engine", "deepspeed", "--task", LANGUAGE, "--local", "--model-size",
                                      "small", "--text-column", "body"])
    assert (config.task_options.model_size, config.task_options.text_column) == ("small", "body")
    config = configuration.from_args([*TRAIN, "--local", "--hidden-sizes", "128,32"])
    assert config.task_options.hidden_sizes == (128, 32)
    with pytest.raises(SystemExit):
        configuration.from_args(["--engine", "deepspeed", "--task", LANGUAGE, "--local", "--model-size", "huge"])


def test_an_unknown_task_module_is_one_line(capsys):
    assert main(["--engine", "torch_distributor", "--task", "nowhere.task", "--local"]) == 2
    assert "no task module 'nowhere.task'" in capsys.readouterr().err


def test_default_local_folders_differ_by_engine_and_task():
    def folder(engine, task):
        return configuration.default_output_dir(Config(engine=engine, task=task))

    folders = {folder(engine, task) for engine in ("torch_distributor", "deepspeed")
               for task in (configuration.DEFAULT_TASK, FARE, LANGUAGE)}
    assert len(folders) == 6


def test_the_run_s_config_reads_back_the_same_from_json(tmp_path):
    config = configuration.from_args(["--engine", "deepspeed", "--task", LANGUAGE, "--local", "--model-size",
                                      "small", "--zero-stage", "3", "--output-dir", str(tmp_path)])
    again = configuration.from_json(json.loads(json.dumps(configuration.to_json(config))), "config.json")
    assert again == config
    with pytest.raises(ValueError, match="unknown fields extra"):
        configuration.from_json({**configuration.to_json(config), "extra": 1}, "config.json")
    with pytest.raises(ValueError, match="is not a run's config"):
        configuration.from_json([1, 2], "config.json")


def test_an_output_folder_that_cannot_be_written_is_refused_before_spark(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main([*TRAIN, "--local", "--output-dir", str(blocker / "run")]) == 1
    assert "cannot write into --output-dir" in capsys.readouterr().err


def test_a_folder_in_use_is_refused_at_once_and_freed_when_its_run_ends(tmp_path):
    with output_folder(str(tmp_path)):
        with pytest.raises(ConfigError, match="in use by another training run \\(pid .*own --output-dir"):
            with output_folder(str(tmp_path)):
                pass
    with output_folder(str(tmp_path)):  # the first run ended: the folder is free again
        pass
