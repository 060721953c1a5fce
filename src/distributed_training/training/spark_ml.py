"""Spark ML pipelines for the fare, run over a Spark Connect session: feature scaling, a regressor, an evaluator.

The same table, features and held-out split as the torch engines (`trips`, `staging.split`), and the same scores:
RMSE and MAE in dollars on the held-out split, beside the RMSE of predicting the training mean. So a Spark ML model
and a neural network trained on one table can be compared line by line.

Two APIs:
- `connect` (default), `pyspark.ml.connect`: the module the platform offers for Spark ML over Spark Connect. It has no
  regressor of its own (only LogisticRegression), so the model is `least_squares.LeastSquaresRegressor`, an
  estimator of that module's kind: one distributed pass sums the normal equations, the driver solves them.
  Its evaluator needs torcheval (and so torch) on the driver and the executors.
- `classic`, `pyspark.ml` over Spark Connect (Spark 4): the full MLlib, trained on the server: linear regression,
  gradient-boosted trees or a random forest.
"""

from __future__ import annotations

from .trips import FEATURE_COLUMNS, LABEL_COLUMN

CONNECT, CLASSIC = "connect", "classic"
APIS = (CONNECT, CLASSIC)
LINEAR, GBT, RANDOM_FOREST = "linear", "gbt", "random_forest"
MODELS = {CONNECT: (LINEAR,), CLASSIC: (LINEAR, GBT, RANDOM_FOREST)}
RAW_FEATURES, FEATURES, PREDICTION = "raw_features", "features", "prediction"


def pipeline(api: str, model: str, seed: int):
    """The unfitted pipeline: assemble the feature columns, scale them to mean 0 and variance 1, regress the fare."""
    if model not in MODELS[api]:
        raise ValueError(f"the {api} API has no {model} model; it offers {', '.join(MODELS[api])}")
    if api == CONNECT:
        from pyspark.ml.connect.feature import ArrayAssembler, StandardScaler
        from pyspark.ml.connect.pipeline import Pipeline

        from .least_squares import LeastSquaresRegressor

        return Pipeline(stages=[
            ArrayAssembler(inputCols=list(FEATURE_COLUMNS), outputCol=RAW_FEATURES,
                           featureSizes=[1] * len(FEATURE_COLUMNS)),
            StandardScaler(inputCol=RAW_FEATURES, outputCol=FEATURES),
            LeastSquaresRegressor(featuresCol=FEATURES, labelCol=LABEL_COLUMN, predictionCol=PREDICTION),
        ])
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from pyspark.ml.regression import GBTRegressor, LinearRegression, RandomForestRegressor

    columns = {"featuresCol": FEATURES, "labelCol": LABEL_COLUMN, "predictionCol": PREDICTION}
    regressor = {
        LINEAR: lambda: LinearRegression(**columns),
        GBT: lambda: GBTRegressor(maxDepth=5, seed=seed, **columns),
        RANDOM_FOREST: lambda: RandomForestRegressor(numTrees=50, maxDepth=8, seed=seed, **columns),
    }[model]()
    return Pipeline(stages=[
        VectorAssembler(inputCols=list(FEATURE_COLUMNS), outputCol=RAW_FEATURES),
        StandardScaler(inputCol=RAW_FEATURES, outputCol=FEATURES, withMean=True, withStd=True),
        regressor,
    ])


def evaluate(api: str, predictions, train_label_mean: float) -> dict:
    """The torch engines' scores on a DataFrame of held-out predictions: RMSE from the API's own evaluator, MAE and
    the RMSE of predicting the training mean from one aggregation."""
    from pyspark.sql import functions as F

    if api == CONNECT:
        from pyspark.ml.connect.evaluation import RegressionEvaluator
    else:
        from pyspark.ml.evaluation import RegressionEvaluator
    rmse = RegressionEvaluator(metricName="rmse", labelCol=LABEL_COLUMN, predictionCol=PREDICTION).evaluate(predictions)
    label, prediction = F.col(LABEL_COLUMN), F.col(PREDICTION)
    row = predictions.agg(
        F.avg(F.abs(prediction - label)).alias("mae"),
        F.sqrt(F.avg((label - F.lit(train_label_mean)) ** 2)).alias("baseline_rmse"),
        F.count(F.lit(1)).alias("rows"),
    ).first()
    if not row["rows"]:
        raise ValueError("the held-out split is empty: train on a larger table")
    return {"test_rmse": float(rmse), "test_mae": float(row["mae"]), "baseline_rmse": float(row["baseline_rmse"]),
            "test_rows": int(row["rows"])}


def save(api: str, model, path: str) -> None:
    """Write the fitted pipeline to `path`: pyspark.ml.connect models from the driver (they live there), classic ones
    from the server (a Unity Catalog volume path on a cluster)."""
    if api == CONNECT:
        model.saveToLocal(path, overwrite=True)
    else:
        model.write().overwrite().save(path)


def load(api: str, path: str):
    if api == CONNECT:
        from pyspark.ml.connect.pipeline import PipelineModel

        return PipelineModel.loadFromLocal(path)
    from pyspark.ml import PipelineModel

    return PipelineModel.load(path)
