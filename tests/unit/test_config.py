"""`train`'s options: one Config (what it refuses is in tests/failures/test_train_refuses.py), the
task's own options on the same command line, and the run's config as a file that reads back the same."""

from __future__ import annotations

import json

import pytest

from distributed_training import config as configuration
from distributed_training.config import Config
from distributed_training.launch import main
from distributed_training.run_folder import FolderInUse, held

from support.runs import FARE, LANGUAGE

TRAIN = ["--engine", "torch_distributor", "--task", FARE]


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


def test_the_optimizer_s_options_read_back_the_same_and_default_to_pre_training_s(tmp_path):
    default = configuration.from_args([*TRAIN, "--local"])
    assert (default.adam_betas, default.lr_schedule, default.min_lr_ratio) == ((0.9, 0.95), "cosine", 0.1)
    config = configuration.from_args([*TRAIN, "--local", "--adam-betas", "0.9,0.999", "--lr-schedule", "linear",
                                      "--min-lr-ratio", "0", "--output-dir", str(tmp_path)])
    assert (config.adam_betas, config.lr_schedule, config.min_lr_ratio) == ((0.9, 0.999), "linear", 0.0)
    assert configuration.from_json(json.loads(json.dumps(configuration.to_json(config))), "config.json") == config


BETAS_REFUSED = "is not two numbers B1,B2, each at least 0 and below 1 (e.g. 0.9,0.999)"


@pytest.mark.parametrize("option, value, message", [
    *(("--adam-betas", betas, f"{betas!r} {BETAS_REFUSED}") for betas in ("0.9", "0.9,0.95,0.99", "0.9,1", "0.9,-0.1",
                                                                         "0.9,nan", "0.9;0.95", "")),
    ("--lr-schedule", "step", "invalid choice: 'step'"),  # argparse lists the choices
    ("--min-lr-ratio", "1.5", "1.5 must be a finite number at least 0 and at most 1"),
    ("--min-lr-ratio", "-0.1", "-0.1 must be a finite number at least 0 and at most 1")])
def test_an_optimizer_option_out_of_its_range_is_refused_naming_it(capsys, option, value, message):
    with pytest.raises(SystemExit):
        configuration.from_args([*TRAIN, "--local", option, value])
    assert f"argument {option}: {message}" in capsys.readouterr().err


def test_a_folder_in_use_is_refused_at_once_and_freed_when_its_run_ends(tmp_path):
    with held(str(tmp_path)):
        with pytest.raises(FolderInUse, match="in use by another training run \\(pid .*own --output-dir"):
            with held(str(tmp_path)):
                pass
    with held(str(tmp_path)):  # the first run ended: the folder is free again
        pass


def test_fsdp2_shards_over_several_processes_and_one_process_trains_the_model_as_it_is():
    """fully_shard needs a process group, which a run of one process does not start: there is nothing to shard."""
    import torch

    from distributed_training.training import strategy
    from distributed_training.training.ranks import Process

    config = configuration.from_args([*TRAIN, "--local", "--parallelism", "fsdp2", "--precision", "fp32"])
    assert config.parallelism == "fsdp2"
    one = Process(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    assert type(strategy.create(config, one)) is strategy.DataParallel
    two = Process(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    assert type(strategy.create(config, two)) is strategy.FullyShardedDataParallel
