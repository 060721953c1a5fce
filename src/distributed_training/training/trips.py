"""The taxi trips table and the features the model learns from, prepared in Spark.

The default training table is `samples.nyctaxi.trips`, which exists on every Databricks workspace. The task is
regression: predict `fare_amount` from what is known about the trip. Rows that make no sense (no fare, no distance,
a drop-off before the pick-up) and outliers are dropped before anything else sees them.
"""

from __future__ import annotations

DEFAULT_TABLE = "samples.nyctaxi.trips"

# The columns of samples.nyctaxi.trips, as Spark DDL; the local sample table has exactly this schema.
TRIPS_SCHEMA = (
    "tpep_pickup_datetime timestamp, tpep_dropoff_datetime timestamp, trip_distance double, "
    "fare_amount double, pickup_zip int, dropoff_zip int"
)
REQUIRED_COLUMNS = ("tpep_pickup_datetime", "tpep_dropoff_datetime", "trip_distance", "fare_amount")

FEATURE_COLUMNS = (
    "trip_distance",
    "duration_minutes",
    "pickup_hour_sin",  # the hour of day on a circle, so 23:00 sits next to 00:00
    "pickup_hour_cos",
    "pickup_weekday_sin",  # the day of week on a circle, so Sunday sits next to Monday
    "pickup_weekday_cos",
)
LABEL_COLUMN = "fare_amount"

# Plausible ranges; anything outside is a recording error or a trip unlike the rest.
MAX_FARE = 250.0
MAX_DISTANCE_MILES = 100.0
MAX_DURATION_MINUTES = 180.0
MAX_SPEED_MPH = 80.0


class TripsTableError(ValueError):
    """The training table cannot be read or lacks the columns the features need."""


def looks_like_path(source: str) -> bool:
    """A table name is `catalog.schema.table` (or shorter); anything with a slash or a scheme is a path."""
    return "/" in source or ":" in source or source.endswith(".parquet")


def read_trips(spark, source: str):
    """The trips as a Spark DataFrame, from a table name (spark.table) or a parquet path (spark.read)."""
    from pyspark.errors import AnalysisException

    try:
        trips = spark.read.parquet(source) if looks_like_path(source) else spark.table(source)
        columns = set(trips.columns)
    except AnalysisException as error:
        kind = "parquet path" if looks_like_path(source) else "table"
        raise TripsTableError(
            f"cannot read the {kind} {source!r}: {str(error).splitlines()[0]}. Pass --table with an existing "
            f"table (catalog.schema.table, default {DEFAULT_TABLE}) or a parquet path"
        ) from None
    missing = [column for column in REQUIRED_COLUMNS if column not in columns]
    if missing:
        raise TripsTableError(
            f"{source!r} lacks the column(s) {', '.join(missing)} that the features are made from; it has "
            f"{', '.join(sorted(columns))}. Pass --table with a table shaped like {DEFAULT_TABLE} ({TRIPS_SCHEMA})"
        )
    return trips


def prepare_features(trips):
    """One row per sensible trip: the feature columns and the label, all float32 (what the model reads)."""
    import math

    from pyspark.sql import functions as F

    pickup, dropoff = F.col("tpep_pickup_datetime"), F.col("tpep_dropoff_datetime")
    duration_minutes = (F.unix_timestamp(dropoff) - F.unix_timestamp(pickup)) / 60.0
    hour_angle = (F.hour(pickup) + F.minute(pickup) / 60.0) * (2 * math.pi / 24)
    weekday_angle = (F.dayofweek(pickup) - 1) * (2 * math.pi / 7)

    trips = (
        trips.select(pickup, dropoff, "trip_distance", "fare_amount")
        .dropna()
        .withColumn("duration_minutes", duration_minutes)
        .where(
            (F.col("fare_amount") > 0) & (F.col("fare_amount") <= MAX_FARE)
            & (F.col("trip_distance") > 0) & (F.col("trip_distance") <= MAX_DISTANCE_MILES)
            & (F.col("duration_minutes") > 0) & (F.col("duration_minutes") <= MAX_DURATION_MINUTES)
            & (F.col("trip_distance") / (F.col("duration_minutes") / 60.0) <= MAX_SPEED_MPH)
        )
    )
    features = {
        "trip_distance": F.col("trip_distance"),
        "duration_minutes": F.col("duration_minutes"),
        "pickup_hour_sin": F.sin(hour_angle),
        "pickup_hour_cos": F.cos(hour_angle),
        "pickup_weekday_sin": F.sin(weekday_angle),
        "pickup_weekday_cos": F.cos(weekday_angle),
        LABEL_COLUMN: F.col("fare_amount"),
    }
    return trips.select(*[features[name].cast("float").alias(name) for name in (*FEATURE_COLUMNS, LABEL_COLUMN)])
