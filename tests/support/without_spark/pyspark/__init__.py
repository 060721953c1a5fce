# Put first on PYTHONPATH, this makes `import pyspark` fail as on a serverless GPU node, which has no Spark.
raise ModuleNotFoundError("No module named 'pyspark' (blocked by tests/support/without_spark)", name="pyspark")
