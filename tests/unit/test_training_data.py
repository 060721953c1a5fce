"""The trips table, its features and the staging, on real local Spark."""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pytest

from distributed_training.training.sample_data import sample_trips, write_sample_trips
from distributed_training.training.staged import StagedData, parquet_files, read_shard
from distributed_training.training.staging import stage_training_data
from distributed_training.training.trips import (
    FEATURE_COLUMNS, LABEL_COLUMN, TRIPS_SCHEMA, TripsTableError, prepare_features, read_trips,
)


@pytest.fixture(scope="module")
def sample_table(spark, tmp_path_factory):
    return write_sample_trips(spark, str(tmp_path_factory.mktemp("trips") / "sample_trips"), rows=2000, seed=3)


def test_the_sample_table_has_the_workspace_tables_schema(spark, sample_table):
    from pyspark.sql.types import _parse_datatype_string

    written = spark.read.parquet(sample_table)
    assert written.schema.simpleString() == _parse_datatype_string(TRIPS_SCHEMA).simpleString()
    assert written.count() == 2000


def test_the_sample_is_seeded_and_its_fare_grows_with_distance():
    first, again, other = sample_trips(500, seed=1), sample_trips(500, seed=1), sample_trips(500, seed=2)
    assert first.equals(again) and not first.equals(other)
    sensible = first[(first.fare_amount > 0) & (first.fare_amount < 500) & (first.trip_distance > 0)]
    assert np.corrcoef(sensible.trip_distance, sensible.fare_amount)[0, 1] > 0.8


def trips_frame(spark, rows):
    return spark.createDataFrame(rows, schema=TRIPS_SCHEMA)


def test_features_drop_nonsense_rows_and_encode_time_on_circles(spark):
    sunday_six = datetime(2016, 1, 3, 6, 0)  # 06:00 is a quarter of the day; Sunday is the first day of the week
    rows = [
        (sunday_six, datetime(2016, 1, 3, 6, 12), 2.0, 11.5, 10001, 10002),  # the one sensible trip: 12 minutes
        (sunday_six, datetime(2016, 1, 3, 6, 12), 2.0, -11.5, 10001, 10002),  # refund
        (sunday_six, datetime(2016, 1, 3, 6, 12), 0.0, 11.5, 10001, 10002),  # no distance
        (sunday_six, datetime(2016, 1, 3, 5, 50), 2.0, 11.5, 10001, 10002),  # dropped off before picked up
        (sunday_six, datetime(2016, 1, 3, 6, 12), 2.0, 999.0, 10001, 10002),  # fare outlier
        (sunday_six, datetime(2016, 1, 3, 6, 1), 5.0, 11.5, 10001, 10002),  # 300 mph
        (sunday_six, None, 2.0, 11.5, 10001, 10002),  # missing drop-off
    ]
    features = prepare_features(trips_frame(spark, rows)).collect()
    assert len(features) == 1
    trip = features[0].asDict()
    assert list(trip) == [*FEATURE_COLUMNS, LABEL_COLUMN]
    assert trip["duration_minutes"] == pytest.approx(12.0)
    assert (trip["pickup_hour_sin"], trip["pickup_hour_cos"]) == pytest.approx((1.0, 0.0), abs=1e-6)
    assert (trip["pickup_weekday_sin"], trip["pickup_weekday_cos"]) == pytest.approx((0.0, 1.0), abs=1e-6)
    assert (trip["trip_distance"], trip["fare_amount"]) == (2.0, 11.5)


def test_a_table_without_the_needed_columns_is_refused_by_name(spark, tmp_path):
    path = str(tmp_path / "no_fares")
    spark.createDataFrame([(1.0,)], "trip_distance double").write.parquet(path)
    with pytest.raises(TripsTableError, match="fare_amount"):
        read_trips(spark, path)
    with pytest.raises(TripsTableError, match="cannot read the table 'nowhere.no.trips'"):
        read_trips(spark, "nowhere.no.trips")


def test_staging_splits_writes_one_file_per_process_and_records_the_training_statistics(spark, sample_table, tmp_path):
    staged = stage_training_data(spark, sample_table, str(tmp_path / "staging"), world_size=2, seed=5)
    assert StagedData.load(staged.directory) == staged
    assert len(parquet_files(staged.train_dir)) == 2 and len(parquet_files(staged.test_dir)) == 2

    columns = [*staged.feature_columns, staged.label_column]
    train = np.vstack([read_shard(staged.train_dir, columns, rank, 2) for rank in range(2)])
    test = np.vstack([read_shard(staged.test_dir, columns, rank, 2) for rank in range(2)])
    assert (len(train), len(test)) == (staged.train_rows, staged.test_rows)
    assert len(train) + len(test) == prepare_features(read_trips(spark, sample_table)).count()
    assert 0.15 < len(test) / (len(train) + len(test)) < 0.25
    for index, stats in enumerate(staged.feature_stats):
        assert stats.mean == pytest.approx(train[:, index].mean(), rel=1e-4)
        assert stats.std == pytest.approx(train[:, index].std(), rel=1e-3)
    assert staged.label_stats.mean == pytest.approx(train[:, -1].mean(), rel=1e-4)
    assert not math.isclose(staged.label_stats.std, 1.0)
