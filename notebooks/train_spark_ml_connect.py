# Databricks notebook source
# MAGIC %md
# MAGIC # Train a Spark ML pipeline through Spark Connect
# MAGIC
# MAGIC What the `train_spark_ml_connect` job runs, with the same arguments as the deployed job: its table, a folder in its
# MAGIC volume, its epochs and experiment. Deploy the bundle first, then attach a cluster like the job's
# MAGIC (`resources/train_spark_ml_connect.job.yml`). The first cell installs this project from the bundle's files, as the job
# MAGIC installs its wheel: the training processes import it on the driver and the executors.

# COMMAND ----------

# MAGIC %pip install --quiet ..

# COMMAND ----------

dbutils.library.restartPython()

# COMMAND ----------

import json

from databricks.sdk import WorkspaceClient

# What `databricks bundle deploy` gave this target's job, read back from the workspace: the notebook trains into the
# bundle's own volume and experiment, whatever names the deploy gave them (a user's or a service principal's). The
# deploy syncs this notebook to <root_path>/files/notebooks/ and writes the jobs' ids to <root_path>/state/metadata.json.
notebook = dbutils.notebook.entry_point.getDbutils().notebook().getContext().notebookPath().get()
root_path = "/Workspace" + notebook.rsplit("/files/notebooks/", 1)[0]
with open(f"{root_path}/state/metadata.json") as file:
    job_id = json.load(file)["config"]["resources"]["jobs"]["train_spark_ml_connect"]["id"]
job = WorkspaceClient().jobs.get(int(job_id)).settings
parameters = job.tasks[0].python_wheel_task.parameters
deployed = {option: parameters[parameters.index(option) + 1] for option in ("--table", "--output-dir",
                                                                            "--mlflow-experiment")}
dbutils.widgets.text("table", deployed["--table"], "Table to train on (empty: the taxi trips)")
dbutils.widgets.text("output_dir", deployed["--output-dir"].replace("{{job.run_id}}", "notebook"),
                     "Output folder (a volume path; a rerun into it resumes there)")
dbutils.widgets.text("epochs", next(parameter.default for parameter in job.parameters if parameter.name == "epochs"),
                     "Epochs")
experiment = deployed["--mlflow-experiment"]

# COMMAND ----------

from distributed_training.launch import main

exit_code = main([
    "--engine",
    "spark_ml_connect",
    "--table",
    dbutils.widgets.get("table"),
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
