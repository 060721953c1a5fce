"""Linear regression as a `pyspark.ml.connect` estimator, which that module lacks (it has only LogisticRegression).

Least squares with a small ridge penalty (not on the intercept), solved exactly: each partition sums X'X and X'y of
its rows (X with a column of ones for the intercept), the driver adds the partial sums and solves the normal
equations. One pass over the data whatever its size; the driver holds (features + 1)^2 numbers. Works on a classic
and on a Spark Connect DataFrame, as the rest of pyspark.ml.connect does.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from pyspark import keyword_only
from pyspark.ml.connect.base import PredictionModel, Predictor
from pyspark.ml.connect.io_utils import CoreModelReadWrite, ParamsReadWrite
from pyspark.ml.connect.util import aggregate_dataframe
from pyspark.ml.param.shared import HasRegParam

DEFAULT_REG_PARAM = 1e-6


class LeastSquaresRegressor(Predictor["LeastSquaresModel"], HasRegParam, ParamsReadWrite):
    @keyword_only
    def __init__(self, *, featuresCol: str = "features", labelCol: str = "label", predictionCol: str = "prediction",
                 regParam: float = DEFAULT_REG_PARAM):
        super().__init__()
        self._setDefault(regParam=DEFAULT_REG_PARAM)
        self._set(**self._input_kwargs)

    def _fit(self, dataset) -> LeastSquaresModel:
        features_column, label_column = self.getFeaturesCol(), self.getLabelCol()

        def partial_sums(batch: pd.DataFrame):
            design = np.column_stack([np.stack(batch[features_column].to_numpy()), np.ones(len(batch))])
            return design.T @ design, design.T @ batch[label_column].to_numpy(dtype=float), len(batch)

        def add(left, right):
            return left[0] + right[0], left[1] + right[1], left[2] + right[2]

        sums = aggregate_dataframe(dataset, [features_column, label_column], partial_sums, add, lambda total: total)
        if sums is None:
            raise ValueError("LeastSquaresRegressor got no training rows")
        gram, moments, rows = sums
        penalty = self.getRegParam() * rows * np.eye(len(gram))
        penalty[-1, -1] = 0.0  # the intercept is not shrunk
        weights = np.linalg.solve(gram + penalty, moments)
        model = LeastSquaresModel(weights[:-1], float(weights[-1]))
        model._resetUid(self.uid)
        return self._copyValues(model)


class LeastSquaresModel(PredictionModel, HasRegParam, ParamsReadWrite, CoreModelReadWrite):
    """prediction = features . coefficients + intercept, computed in a pandas UDF."""

    def __init__(self, coefficients=None, intercept: float | None = None):
        super().__init__()
        self.coefficients = None if coefficients is None else np.asarray(coefficients, dtype=float)
        self.intercept = intercept

    @property
    def numFeatures(self) -> int:
        return -1 if self.coefficients is None else len(self.coefficients)

    def _input_columns(self) -> list[str]:
        return [self.getFeaturesCol()]

    def _output_columns(self) -> list[tuple[str, str]]:
        return [(self.getPredictionCol(), "double")]

    def _get_transform_fn(self):
        coefficients, intercept = self.coefficients, self.intercept

        def predict(features: pd.Series) -> pd.Series:
            return pd.Series(np.stack(features.to_numpy()) @ coefficients + intercept, index=features.index)

        return predict

    def _get_core_model_filename(self) -> str:
        return f"{type(self).__name__}.json"

    def _save_core_model(self, path: str) -> None:
        with open(path, "w") as file:
            json.dump({"coefficients": self.coefficients.tolist(), "intercept": self.intercept}, file)

    def _load_core_model(self, path: str) -> None:
        with open(path) as file:
            saved = json.load(file)
        self.coefficients, self.intercept = np.asarray(saved["coefficients"], dtype=float), saved["intercept"]
