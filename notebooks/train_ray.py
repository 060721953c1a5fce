# Databricks notebook source
# MAGIC %md
# MAGIC # Train with Ray on Spark
# MAGIC
# MAGIC Runs the project's `train` entry point (the one the `train_ray` job calls) on the cluster this
# MAGIC notebook is attached to. Use a cluster like the job's: see `resources/train_ray.job.yml`.

# COMMAND ----------

dbutils.widgets.text("table", "samples.nyctaxi.trips", "Table to train on")
dbutils.widgets.text("output_dir", "/Volumes/main/default/distributed_training_training/notebook-ray", "Output folder (a volume path)")
dbutils.widgets.text("epochs", "5", "Epochs")

# COMMAND ----------

import os
import sys

sys.path.insert(0, os.path.abspath("../src"))  # the bundle syncs src/ beside this notebook

from distributed_training.cli import main

exit_code = main([
    "train", "--engine", "ray",
    "--table", dbutils.widgets.get("table"),
    "--output-dir", dbutils.widgets.get("output_dir"),
    "--epochs", dbutils.widgets.get("epochs"),
])
assert exit_code == 0, f"training failed (exit code {exit_code}): see the output above"
