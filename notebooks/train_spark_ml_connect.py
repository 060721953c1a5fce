# Databricks notebook source
# MAGIC %md
# MAGIC # Train a Spark ML pipeline through Spark Connect
# MAGIC
# MAGIC What the `train_spark_ml_connect` job runs, with the same arguments: the job's table, its output folder in this
# MAGIC target's volume, its epochs. Attach a cluster like the job's (`resources/train_spark_ml_connect.job.yml`). The first
# MAGIC cell installs this project from the bundle's files, as the job installs its wheel: the training processes
# MAGIC import it on the driver and the executors.

# COMMAND ----------

# MAGIC %pip install --quiet ..

# COMMAND ----------

dbutils.library.restartPython()

# COMMAND ----------

import re

# Where the dev target put this notebook: <root_path>/files/notebooks/; its experiment lies in <root_path>.
notebook = dbutils.notebook.entry_point.getDbutils().notebook().getContext().notebookPath().get()
root_path = "/Workspace" + notebook.split("/files/")[0]
# The dev target's volume, dev_<short name>_..., as databricks.yml names it for the deploying user.
user = spark.sql("SELECT current_user()").first()[0]
short_name = re.sub(r"[^a-z0-9]+", "_", user.split("@")[0].lower()).strip("_")
volume = f"/Volumes/main/default/dev_{short_name}_distributed_training_training"
dbutils.widgets.text("output_dir", f"{volume}/notebook-spark_ml_connect", "Output folder (a volume path)")
dbutils.widgets.text("epochs", "5", "Epochs")
experiment = f"{root_path}/distributed-training-spark_ml_connect"

# COMMAND ----------

from distributed_training.launch import main

exit_code = main([
    "--engine",
    "spark_ml_connect",
    "--output-dir",
    dbutils.widgets.get("output_dir"),
    "--epochs",
    dbutils.widgets.get("epochs"),
    "--mlflow-experiment",
    experiment,
    "--spark-ml-api",
    "classic",
])
assert exit_code == 0, f"training failed (exit code {exit_code}): see the output above"
