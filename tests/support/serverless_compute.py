"""Serverless compute's Spark, as the platform harness gives it to a task that runs there (a serverless GPU job's
`stage` task): a Spark Connect session (SPARK_REMOTE, a local Connect server here), which has no SparkContext and no
RDDs, and which refuses to cache what it computes, as serverless compute does (Databricks docs, "Serverless compute
limitations": no caching APIs; "Cache DataFrames on serverless compute" is a preview of environment 5 and later that an
admin may turn off, and the stage task's environment is 4). Local Spark caches whatever it is asked to, so without
this a test could not see a cache() that fails on the platform."""

REFUSAL = "[NOT_SUPPORTED_WITH_SERVERLESS] PERSIST TABLE is not supported on serverless compute. SQLSTATE: 0A000"
SPARK_REMOTE = "local[2]"  # SparkSession.builder.getOrCreate() starts a local Connect server and connects to it


def refuse_caching() -> None:
    """DataFrame.cache/persist and Catalog.cacheTable of the Connect client raise the platform's error."""
    from pyspark.errors.exceptions.connect import AnalysisException
    from pyspark.sql.connect.catalog import Catalog
    from pyspark.sql.connect.dataframe import DataFrame

    def refused(*_args, **_kwargs):
        raise AnalysisException(message=REFUSAL, errorClass="NOT_SUPPORTED_WITH_SERVERLESS", sql_state="0A000")

    DataFrame.cache = DataFrame.persist = Catalog.cacheTable = refused
