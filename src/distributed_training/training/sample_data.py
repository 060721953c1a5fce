"""A small local stand-in for `samples.nyctaxi.trips`: same schema, a plausible fare, noise and a few bad rows.

`train --local` and the tests train on it, so that a laptop sees the same pipeline as a workspace. The fare follows
a metered tariff (a flag fall, a rate per mile and per minute, night and rush-hour surcharges) plus noise, so a
model can learn it and a mean prediction cannot.
"""

from __future__ import annotations

from .trips import TRIPS_SCHEMA

DEFAULT_ROWS = 4000
MANHATTAN_ZIPS = (10001, 10002, 10003, 10011, 10012, 10013, 10014, 10016, 10019, 10022, 10023, 10024, 10028, 10036)


def sample_trips(rows: int = DEFAULT_ROWS, seed: int = 7):
    """The sample trips as a pandas DataFrame with the columns of the workspace table."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    start = np.datetime64("2016-01-01T00:00:00")
    pickup = start + rng.integers(0, 60 * 24 * 3600, rows).astype("timedelta64[s]")  # January and February 2016
    hour = (pickup - pickup.astype("datetime64[D]")).astype("timedelta64[h]").astype(int)
    weekday = (pickup.astype("datetime64[D]").astype(int) + 3) % 7  # 0 = Monday (1970-01-01 was a Thursday)

    distance = np.clip(rng.lognormal(mean=0.6, sigma=0.75, size=rows), 0.1, 30.0).round(2)
    rush_hour = (weekday < 5) & (((hour >= 7) & (hour < 10)) | ((hour >= 16) & (hour < 20)))
    night = (hour >= 20) | (hour < 6)
    speed_mph = np.where(rush_hour, 8.0, np.where(night, 18.0, 12.0)) * rng.lognormal(0.0, 0.2, rows)
    duration_minutes = distance / speed_mph * 60.0 + rng.uniform(0.5, 3.0, rows)  # plus time standing still
    dropoff = pickup + (duration_minutes * 60).astype("timedelta64[s]")

    fare = 2.5 + 2.5 * distance + 0.35 * duration_minutes + 0.5 * night + 1.0 * (rush_hour & (hour >= 16))
    fare = np.maximum(np.round((fare + rng.normal(0.0, 1.5, rows)) * 2) / 2, 2.5)  # the meter counts in halves

    # About 2% nonsense, as in real trip records: refunds, zero-distance trips, clocks that ran backwards.
    bad = rng.random(rows) < 0.02
    kind = rng.integers(0, 4, rows)
    fare = np.where(bad & (kind == 0), -fare, fare)
    distance = np.where(bad & (kind == 1), 0.0, distance)
    dropoff = np.where(bad & (kind == 2), pickup - np.timedelta64(300, "s"), dropoff)
    fare = np.where(bad & (kind == 3), 999.0, fare)

    return pd.DataFrame({
        "tpep_pickup_datetime": pd.to_datetime(pickup),
        "tpep_dropoff_datetime": pd.to_datetime(dropoff),
        "trip_distance": distance,
        "fare_amount": fare,
        "pickup_zip": rng.choice(MANHATTAN_ZIPS, rows).astype("int32"),
        "dropoff_zip": rng.choice(MANHATTAN_ZIPS, rows).astype("int32"),
    })


def write_sample_trips(spark, path: str, rows: int = DEFAULT_ROWS, seed: int = 7) -> str:
    """Write the sample trips as a parquet table at `path` (replacing what is there); returns the path."""
    trips = spark.createDataFrame(sample_trips(rows, seed), schema=TRIPS_SCHEMA)
    trips.coalesce(1).write.mode("overwrite").parquet(path)
    return path
