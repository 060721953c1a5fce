"""Bring your own model, a worked example: `task.py` changed into a classifier. Nothing else in the project changes.

The question: will a taxi trip take more than 20 minutes, from its distance and the hour it starts? The model is a
small network with a logistic output; its loss, binary cross-entropy, is stated against the trivial predictor that
gives every trip the training split's share of long trips. Try it as it is:

    PYTHONPATH=. python -m {{ cookiecutter.package_name }} train --engine {{ (torch_engines(cookiecutter) + ["torch_distributor"])[0] }} --local --task examples.trip_classifier

then make it yours: copy it over src/{{ cookiecutter.package_name }}/task.py, or edit task.py the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

try:
    import torch
    from torch import nn
    from torch.nn import functional as F
except ModuleNotFoundError:  # the serverless stage task prepares the data with Spark alone: it has no torch
    torch = F = None
    nn = type("nn", (), {"Module": object})

DEFAULT_TABLE = "samples.nyctaxi.trips"
FEATURES = ("trip_distance", "pickup_hour")
LABEL = "long_trip"


@dataclass(frozen=True)
class Options:
    minutes: float = field(default=20.0, metadata={"help": "a trip longer than this is a long one"})
    width: int = field(default=32, metadata={"help": "the hidden layer's width"})


def sample_table(spark, seed: int):
    """Trips with the default table's columns: the duration grows with the distance, slower at rush hour."""
    from pyspark.sql import functions as F

    distance = F.exp(F.randn(seed) * 0.7 + 0.6)
    hour = F.floor(F.rand(seed + 1) * 24)
    rush = F.when(hour.between(7, 9) | hour.between(16, 19), 2.0).otherwise(1.0)
    pickup = F.timestamp_seconds(F.lit(1451606400) + hour * 3600 + F.floor(F.rand(seed + 2) * 60) * 86400)
    minutes = F.col("trip_distance") * 4 * F.col("rush") + F.rand(seed + 3) * 4
    return (spark.range(4000).select(distance.alias("trip_distance"), pickup.alias("tpep_pickup_datetime"),
                                     rush.alias("rush"))
            .withColumn("tpep_dropoff_datetime", F.timestamp_seconds(F.unix_timestamp("tpep_pickup_datetime")
                                                                     + (minutes * 60).cast("long")))
            .drop("rush"))


def prepare(table, options: Options):
    from pyspark.sql import functions as F

    minutes = (F.unix_timestamp("tpep_dropoff_datetime") - F.unix_timestamp("tpep_pickup_datetime")) / 60
    return table.select(F.col("trip_distance").cast("float"), F.hour("tpep_pickup_datetime").cast("float")
                        .alias("pickup_hour"), (minutes > options.minutes).cast("float").alias(LABEL)).dropna()


def statistics(train, options: Options) -> dict:
    from pyspark.sql import functions as F

    row = train.agg(*[F.mean(name).alias(name) for name in (*FEATURES, LABEL)],
                    *[F.stddev_pop(name).alias(f"{name}_std") for name in FEATURES]).first()
    return {"means": [row[name] for name in FEATURES], "stds": [row[f"{name}_std"] or 1.0 for name in FEATURES],
            "long_share": row[LABEL]}


def examples(rows, stats: dict, options: Options) -> tuple:
    features = torch.stack([torch.from_numpy(rows.column(name).to_numpy().astype("float32")) for name in FEATURES], 1)
    labels = torch.from_numpy(rows.column(LABEL).to_numpy().astype("float32"))
    return (features - torch.tensor(stats["means"])) / torch.tensor(stats["stds"]), labels


def build_model(stats: dict, options: Options):
    return nn.Sequential(nn.Linear(len(FEATURES), options.width), nn.ReLU(), nn.Linear(options.width, 1),
                         nn.Flatten(0))


def loss(model, batch):
    features, labels = batch
    return F.binary_cross_entropy_with_logits(model(features).float(), labels)


def evaluate(model, batch, stats: dict) -> dict:
    features, labels = batch
    logits = model(features).float()
    share = torch.full_like(labels, stats["long_share"])
    return {"log_loss": float(F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")),
            "baseline_log_loss": float(F.binary_cross_entropy(share, labels, reduction="sum")),
            "correct": float(((logits > 0).float() == labels).sum()), "rows": len(labels)}


def summarize(sums: dict, stats: dict) -> dict:
    rows = sums["rows"]
    return {"held_out_loss": sums["log_loss"] / rows, "baseline_loss": sums["baseline_log_loss"] / rows,
            "accuracy": sums["correct"] / rows, "baseline_accuracy": max(stats["long_share"], 1 - stats["long_share"]),
            "test_rows": int(rows)}


def exported_model(model, stats: dict, batch) -> tuple:
    """What MLflow logs: normalised features in, the logit of a long trip out."""
    return model.eval(), batch[0][:5].numpy()
