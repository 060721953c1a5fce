"""A test task: the fare task with dropout in its model, so that every training step draws random numbers (no built-in
task does). A resume that does not restore the random generators' states trains on with other dropout masks."""

from torch import nn

from distributed_training.tasks.fare_regression import (DEFAULT_TABLE, FEATURES, FareRegressor, Options, evaluate,
                                                        examples, exported_model, loss, prepare, sample_table,
                                                        statistics, summarize)

__all__ = ["DEFAULT_TABLE", "Options", "sample_table", "prepare", "statistics", "examples", "build_model", "loss",
           "evaluate", "summarize", "exported_model"]


def build_model(stats: dict, options: Options):
    model = FareRegressor(len(FEATURES), options.hidden_sizes)
    model.layers.insert(1, nn.Dropout(0.3))  # after the first layer: in training mode a new mask every forward pass
    return model
