# Databricks notebook source
# MAGIC %md
# MAGIC # Train with Ray on Spark
# MAGIC
# MAGIC What the `train_ray` job runs, with the same arguments as the deployed job: its table, its volume, its
# MAGIC epochs and experiment. Deploy the bundle first (from a laptop, or from this folder in the workspace), then attach
# MAGIC a cluster like the job's (`resources/train_ray.job.yml`). The first cell installs this project from the
# MAGIC bundle's files, as the job installs its wheel: the training processes import it on the driver and the executors.
# MAGIC Each run of the notebook trains in a new folder of the volume, as each job run does; to resume one that stopped,
# MAGIC give its folder as `resume_from`.

# COMMAND ----------

# MAGIC %pip install --quiet ..

# COMMAND ----------

dbutils.library.restartPython()

# COMMAND ----------

import json
import time
import uuid

from databricks.sdk import WorkspaceClient

# What `databricks bundle deploy` gave this target's job, read back from the workspace: the notebook trains into the
# bundle's own volume and experiment, whatever names the deploy gave them (a user's or a service principal's). The
# deploy writes the jobs' ids to <root_path>/state/metadata.json. From a laptop it copies this notebook to
# <root_path>/files/notebooks/; a dev deploy from the workspace (a Git folder, the web terminal) is source-linked: the
# notebook stays where it is, and the root path is the dev target's default (Databricks CLI,
# bundle/config/mutator/apply_source_linked_deployment_preset.go, default_workspace_root.go).
notebook = "/Workspace" + dbutils.notebook.entry_point.getDbutils().notebook().getContext().notebookPath().get()
if "/files/notebooks/" in notebook:
    root_path = notebook.rsplit("/files/notebooks/", 1)[0]
else:
    root_path = f"/Workspace/Users/{WorkspaceClient().current_user.me().user_name}/.bundle/distributed-training/dev"
try:
    with open(f"{root_path}/state/metadata.json") as file:
        deployment = json.load(file)["config"]
except FileNotFoundError:
    raise RuntimeError(f"no deployment of this bundle at {root_path}: deploy it first (`databricks bundle deploy`)") \
        from None
deployed_from = deployment["workspace"]["file_path"]  # the files the deployment's jobs run: this notebook's, or not
if not notebook.startswith(deployed_from.rstrip("/") + "/"):
    raise RuntimeError(f"the deployment at {root_path} runs the files in {deployed_from}, not this notebook's: deploy "
                       "from this notebook's folder first, or open the notebook there")
job = WorkspaceClient().jobs.get(int(deployment["resources"]["jobs"]["train_ray"]["id"])).settings
parameters = job.tasks[0].python_wheel_task.parameters
deployed = {option: parameters[parameters.index(option) + 1] for option in ("--table", "--output-dir",
                                                                            "--mlflow-experiment")}
dbutils.widgets.text("table", deployed["--table"], "Table to train on (empty: the task's own)")
dbutils.widgets.text("epochs", next(parameter.default for parameter in job.parameters if parameter.name == "epochs"),
                     "Epochs")
dbutils.widgets.text("resume_from", "", "Folder of an earlier run to resume (empty: a new run)")
# A job run trains in <volume>/<engine>/<job run id>, a notebook run in <volume>/<engine>/notebook-<time>-<random>.
output_dir = dbutils.widgets.get("resume_from") or (deployed["--output-dir"].rsplit("/", 1)[0] +
                                                    time.strftime("/notebook-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6])
print(f"Training in {output_dir} (to resume this run, give that folder as resume_from)")
experiment = deployed["--mlflow-experiment"]

# COMMAND ----------

from distributed_training.launch import main

exit_code = main([
    "--engine",
    "ray",
    "--table",
    dbutils.widgets.get("table"),
    "--output-dir",
    output_dir,
    "--epochs",
    dbutils.widgets.get("epochs"),
    "--mlflow-experiment",
    experiment,
    "--num-nodes",
    "1",
    "--gpus-per-node",
    "4",
])
assert exit_code == 0, f"training failed (exit code {exit_code}): see the output above"
