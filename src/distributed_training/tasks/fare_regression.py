"""The task: predict a taxi trip's fare from what is known about the trip (regression on a table).

Everything this project trains is defined here; the loop, the launchers, checkpoints and MLflow know it only through
the names below (`Task` in task_interface.py): to train your own model, change this file. The default table is in every
Databricks workspace; rows that make no sense (no fare, no distance, a drop-off before the pick-up) and outliers are
dropped first. The model, a small multilayer perceptron on normalised features, is scored against the training mean."""

import math
from dataclasses import dataclass, field

try:
    import torch
    from torch import nn
    from torch.nn import functional as F
except ModuleNotFoundError:  # the serverless stage task prepares the data with Spark alone: it has no torch
    torch = F = None
    nn = type("nn", (), {"Module": object})

DEFAULT_TABLE = "samples.nyctaxi.trips"
# The columns of samples.nyctaxi.trips, as Spark DDL; the sample table has exactly this schema.
TRIPS_SCHEMA = ("tpep_pickup_datetime timestamp, tpep_dropoff_datetime timestamp, trip_distance double, "
                "fare_amount double, pickup_zip int, dropoff_zip int")
FEATURES = ("trip_distance", "duration_minutes",
            "pickup_hour_sin", "pickup_hour_cos",  # the hour of day on a circle, so 23:00 sits next to 00:00
            "pickup_weekday_sin", "pickup_weekday_cos")  # the day of week on a circle, so Sunday sits next to Monday
LABEL = "fare_amount"
# Plausible ranges; anything outside is a recording error or a trip unlike the rest.
MAX_FARE, MAX_DISTANCE_MILES, MAX_DURATION_MINUTES, MAX_SPEED_MPH = 250.0, 100.0, 180.0, 80.0


@dataclass(frozen=True)
class Options:
    hidden_sizes: tuple[int, ...] = field(default=(64, 64), metadata={"help": "widths of the hidden layers"})


# ---------------------------------------------------------------- Spark side: from the table to rows of numbers

def sample_table(spark, seed: int, rows: int = 4000):
    """Trips with the default table's schema: a metered tariff (flag fall, per mile, per minute, night and rush-hour
    surcharges) plus noise, so a model can learn it and the mean cannot; and about 2% nonsense rows."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    pickup = np.datetime64("2016-01-01T00:00:00") + rng.integers(0, 60 * 24 * 3600, rows).astype("timedelta64[s]")
    hour = (pickup - pickup.astype("datetime64[D]")).astype("timedelta64[h]").astype(int)
    weekday = (pickup.astype("datetime64[D]").astype(int) + 3) % 7  # 0 = Monday (1970-01-01 was a Thursday)
    distance = np.clip(rng.lognormal(mean=0.6, sigma=0.75, size=rows), 0.1, 30.0).round(2)
    rush_hour = (weekday < 5) & (((hour >= 7) & (hour < 10)) | ((hour >= 16) & (hour < 20)))
    night = (hour >= 20) | (hour < 6)
    speed_mph = np.where(rush_hour, 8.0, np.where(night, 18.0, 12.0)) * rng.lognormal(0.0, 0.2, rows)
    minutes = distance / speed_mph * 60.0 + rng.uniform(0.5, 3.0, rows)  # plus time standing still
    dropoff = pickup + (minutes * 60).astype("timedelta64[s]")
    fare = 2.5 + 2.5 * distance + 0.35 * minutes + 0.5 * night + 1.0 * (rush_hour & (hour >= 16))
    fare = np.maximum(np.round((fare + rng.normal(0.0, 1.5, rows)) * 2) / 2, 2.5)  # the meter counts in halves
    bad, kind = rng.random(rows) < 0.02, rng.integers(0, 4, rows)  # refunds, no distance, clocks run backwards
    fare = np.where(bad & (kind == 0), -fare, np.where(bad & (kind == 3), 999.0, fare))
    distance = np.where(bad & (kind == 1), 0.0, distance)
    dropoff = np.where(bad & (kind == 2), pickup - np.timedelta64(300, "s"), dropoff)
    zips = (10001, 10002, 10003, 10011, 10012, 10013, 10014, 10016, 10019, 10022, 10023, 10024, 10028, 10036)
    trips = pd.DataFrame({
        "tpep_pickup_datetime": pd.to_datetime(pickup), "tpep_dropoff_datetime": pd.to_datetime(dropoff),
        "trip_distance": distance, "fare_amount": fare, "pickup_zip": rng.choice(zips, rows).astype("int32"),
        "dropoff_zip": rng.choice(zips, rows).astype("int32")})
    return spark.createDataFrame(trips, schema=TRIPS_SCHEMA)


def prepare(table, options: Options, keep=()):
    """One row per sensible trip: the features and the label, float32 (and the columns `keep`, as they are)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NumericType, TimestampNTZType, TimestampType

    times, numbers = (TimestampType, TimestampNTZType), NumericType
    kinds = {"tpep_pickup_datetime": times, "tpep_dropoff_datetime": times, "trip_distance": numbers, LABEL: numbers}
    if wrong := [f"{name} ({dict(table.dtypes).get(name, 'missing')})" for name, kind in kinds.items()
                 if name not in table.columns or not isinstance(table.schema[name].dataType, kind)]:
        raise ValueError(f"the features are made from timestamps (the times) and numbers (distance, fare), which the "
                         f"column(s) {', '.join(wrong)} are not; the table has {', '.join(table.columns)}. Cast them, "
                         f"or pass --table with a table shaped like {DEFAULT_TABLE}")
    pickup, dropoff = F.col("tpep_pickup_datetime"), F.col("tpep_dropoff_datetime")
    minutes = (F.unix_timestamp(dropoff) - F.unix_timestamp(pickup)) / 60.0
    hour_angle = (F.hour(pickup) + F.minute(pickup) / 60.0) * (2 * math.pi / 24)
    weekday_angle = (F.dayofweek(pickup) - 1) * (2 * math.pi / 7)
    trips = (table.select(pickup, dropoff, "trip_distance", LABEL, *keep).dropna()
             .withColumn("duration_minutes", minutes)
             .where((F.col(LABEL) > 0) & (F.col(LABEL) <= MAX_FARE)
                    & (F.col("trip_distance") > 0) & (F.col("trip_distance") <= MAX_DISTANCE_MILES)
                    & (F.col("duration_minutes") > 0) & (F.col("duration_minutes") <= MAX_DURATION_MINUTES)
                    & (F.col("trip_distance") / (F.col("duration_minutes") / 60.0) <= MAX_SPEED_MPH)))
    columns = {"trip_distance": F.col("trip_distance"), "duration_minutes": F.col("duration_minutes"),
               "pickup_hour_sin": F.sin(hour_angle), "pickup_hour_cos": F.cos(hour_angle),
               "pickup_weekday_sin": F.sin(weekday_angle), "pickup_weekday_cos": F.cos(weekday_angle),
               LABEL: F.col(LABEL)}
    return trips.select(*[columns[name].cast("float").alias(name) for name in (*FEATURES, LABEL)], *keep)


def statistics(train, options: Options) -> dict:
    """Mean and standard deviation of every column of the training split (a constant column gets 1)."""
    from pyspark.sql import functions as F

    columns = (*FEATURES, LABEL)
    row = train.agg(*[F.mean(name).alias(f"{name}_mean") for name in columns],
                    *[F.stddev_pop(name).alias(f"{name}_std") for name in columns]).first()
    return {name: {"mean": float(row[f"{name}_mean"]), "std": float(row[f"{name}_std"]) or 1.0} for name in columns}


# ---------------------------------------------------------------- torch side: the model, its loss and its scores

def examples(rows, stats: dict, options: Options) -> tuple:
    """(normalised features, normalised fare): what the model reads and predicts."""
    normalised = [(torch.from_numpy(rows.column(name).to_numpy().astype("float32")) - stats[name]["mean"])
                  / stats[name]["std"] for name in (*FEATURES, LABEL)]
    return torch.stack(normalised[:-1], dim=1), normalised[-1]


class FareRegressor(nn.Module):
    def __init__(self, features: int, hidden_sizes: tuple[int, ...]):
        super().__init__()
        widths = (features, *hidden_sizes)
        layers = [layer for inputs, outputs in zip(widths, widths[1:]) for layer in (nn.Linear(inputs, outputs),
                                                                                     nn.ReLU())]
        self.layers = nn.Sequential(*layers, nn.Linear(widths[-1], 1))

    def forward(self, features):
        """(batch, features) -> (batch,)"""
        return self.layers(features).squeeze(-1)


def build_model(stats: dict, options: Options):
    return FareRegressor(len(FEATURES), options.hidden_sizes)


def loss(model, batch):
    features, fares = batch
    return F.mse_loss(model(features).float(), fares)


def evaluate(model, batch, stats: dict) -> dict:
    """Sums in normalised units; the baseline predicts the training mean, 0 once normalised."""
    features, fares = batch
    errors = model(features).float() - fares
    return {"squared_error": float((errors ** 2).sum()), "absolute_error": float(errors.abs().sum()),
            "baseline_squared_error": float((fares ** 2).sum()), "rows": len(fares)}


def summarize(sums: dict, stats: dict) -> dict:
    """The mean squared errors (the loss) and the errors in dollars."""
    rows, dollars = sums["rows"], stats[LABEL]["std"]
    held_out, baseline = sums["squared_error"] / rows, sums["baseline_squared_error"] / rows
    return {"held_out_loss": held_out, "baseline_loss": baseline, "test_rmse": math.sqrt(held_out) * dollars,
            "test_mae": sums["absolute_error"] / rows * dollars, "baseline_rmse": math.sqrt(baseline) * dollars,
            "test_rows": int(rows)}


class FarePredictor(nn.Module):
    """The regressor with its normalisation around it: raw features in, fares in dollars out."""

    def __init__(self, regressor, stats: dict):
        super().__init__()
        self.regressor = regressor
        self.register_buffer("means", torch.tensor([stats[name]["mean"] for name in FEATURES]))
        self.register_buffer("stds", torch.tensor([stats[name]["std"] for name in FEATURES]))
        self.fare_mean, self.fare_std = stats[LABEL]["mean"], stats[LABEL]["std"]

    def forward(self, features):
        return self.regressor((features.float() - self.means) / self.stds) * self.fare_std + self.fare_mean


SCORES = "predicted_fare double"


def score(model, rows, stats: dict, options: Options) -> dict:
    """Each prepared trip's fare as the model predicts it, in dollars."""
    features = torch.from_numpy(rows[list(FEATURES)].to_numpy("float32"))
    predictor = FarePredictor(model, stats).to(next(model.parameters()).device)
    return {"predicted_fare": predictor(features.to(predictor.means.device)).double().cpu().numpy()}


def exported_model(model, stats: dict, batch) -> tuple:
    """What MLflow logs: trips' raw features in, fares out; a few held-out trips as its input example."""
    predictor = FarePredictor(model, stats).eval()
    return predictor, (batch[0][:5] * predictor.stds + predictor.means).numpy()
