"""Run a rendered bundle's jobs on this machine the way the Databricks platform runs them.

What it stands in for, and how (the sources are the Databricks CLI v1.13.0 and the Jobs docs):
- `databricks bundle deploy`: the bundle is loaded and merged for a target with the tool's own loader (the one
  `validate` uses), its `${var.*}`, `${bundle.*}`, `${workspace.*}` and `${resources.*}` references resolved as the CLI
  resolves them (variables from --var-style overrides, then the target, then the defaults; the workspace paths'
  defaults under /Workspace/Users/<user>/.bundle/<bundle>/<target>; a job's id for `${resources.jobs.<key>.id}`).
- The Jobs service: each run gets an id of its own, and `{{job.run_id}}`, `{{job.id}}`, `{{job.parameters.<name>}}`,
  `{{job.repair_count}}`, `{{task.name}}`, `{{task.run_id}}` and `{{task.execution_count}}` are filled into task
  parameters, also inside longer strings (Jobs docs, "Dynamic value references"); an unknown name in those namespaces
  is refused, as the Jobs service refuses it. Tasks run in `depends_on` order; one whose upstream failed is
  UPSTREAM_FAILED. A failed task is retried `max_retries` times with the same job run id (no wait: the harness does
  not sleep out `min_retry_interval_millis`); `repair` reruns a run's unsuccessful tasks, again with the same job run
  id, and counts `{{job.repair_count}}`. The job runs and task runs are recorded in a `FakeWorkspace`, whose Jobs API
  (runs/get, runs/get-output) the tasks' own code may ask, over real HTTP.
- The compute: a task on serverless compute (an `environment_key`, no cluster) gets serverless compute's Spark: a Spark
  Connect session that refuses to cache, as the platform does (serverless_compute.py); `/Volumes/...` is a folder under
  the harness's root (the volumes' FUSE mount); a `python_wheel_task`
  runs its entry point (from the project's pyproject.toml) in a fresh Python with the project's `src/` on the path,
  where the wheel would be installed; a job cluster's GPUs are CPU processes here, so `--gpus-per-node G` becomes
  `--processes N` (N = `cpu_processes`), and a job cluster's Spark is a local session. An `ai_runtime_task` runs its `command_path`
  (the bundle's synced copy: `${workspace.file_path}` is the project folder) with what the AI Runtime sets on a node:
  CODE_SOURCE_PATH (the `code_source_path` folder, as the CLI packages and the runtime unpacks it), NODE_RANK,
  NUM_NODES, MASTER_ADDR, MASTER_PORT, WORLD_SIZE, LOCAL_WORLD_SIZE and MLFLOW_RUN_ID: an MLflow run the platform opens
  for each attempt in the task's experiment (`mlflow_experiment_directory`/`experiment`, less /Workspace), ended as
  the attempt ends. MLflow itself is a file store under the root, standing in for the workspace's tracking server.
What it does not do: build or install the wheel, start clusters, run several nodes, or sleep between retries.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from distributed_training.tooling.bundle.loader import load_bundle
from distributed_training.tooling.bundle.references import Resolver, references_in, substitute
from distributed_training.tooling.bundle.variables import Variable, target_variables

from . import serverless_compute
from .fake_workspace import DUMMY_TOKEN, FakeWorkspace

DYNAMIC = re.compile(r"\{\{\s*([A-Za-z_][\w.`-]*)\s*\}\}")
KNOWN_NAMESPACES = ("job", "task", "tasks")
FIRST_RUN_ID = 550315892394120  # the Jobs docs' example run id; each run counts on from it
SUCCESS, FAILED, UPSTREAM_FAILED = "SUCCESS", "FAILED", "UPSTREAM_FAILED"
TASK_TIMEOUT = 900  # seconds: a task of the harness's small runs that takes longer has hung


class PlatformError(RuntimeError):
    """The bundle asks for something the platform (or this harness) refuses: the message says what."""


@dataclass
class TaskAttempt:
    task_key: str
    run_id: int  # the task run's own id ({{task.run_id}})
    attempt: int  # 0 for the first; retries and repairs count on
    state: str
    exit_code: int | None
    output: str  # stdout and stderr, interleaved

    def tail(self, characters: int = 4000) -> str:
        return self.output[-characters:]


@dataclass
class JobRun:
    job_key: str
    job_id: int
    run_id: int
    parameters: dict[str, str]
    repair_count: int = 0
    attempts: list[TaskAttempt] = field(default_factory=list)

    def latest(self, task_key: str) -> TaskAttempt | None:
        tried = [attempt for attempt in self.attempts if attempt.task_key == task_key]
        return tried[-1] if tried else None

    @property
    def state(self) -> str:
        states = {attempt.task_key: attempt.state for attempt in self.attempts}
        return SUCCESS if states and all(state == SUCCESS for state in states.values()) else FAILED

    def report(self) -> str:
        return "\n".join(f"--- {attempt.task_key} attempt {attempt.attempt}: {attempt.state} "
                         f"(exit {attempt.exit_code})\n{attempt.tail()}" for attempt in self.attempts)


@dataclass(frozen=True)
class Interrupt:
    """Kill a task's process and all it started (SIGKILL: a lost node) in these attempts, once `when(job_run)` holds."""
    task_key: str
    when: Callable[[JobRun], bool]
    attempts: tuple[int, ...] = (0,)


class LocalPlatform:
    def __init__(self, project: Path, root: Path, workspace: FakeWorkspace, *, target: str = "dev",
                 user: str = "someone@example.com", variables: dict[str, str] | None = None,
                 lookups: dict[str, str] | None = None, cpu_processes: int = 2):
        self.project, self.root, self.workspace, self.target = Path(project), Path(root), workspace, target
        self.cpu_processes = cpu_processes
        self.mlflow_uri = f"file:{self.root / 'mlflow'}"
        self.tree = self._deployed(user, variables or {}, lookups or {})
        self.jobs = self.tree.get("resources", {}).get("jobs", {})
        self.job_ids = {key: int(job["id"]) for key, job in self.jobs.items()}
        self._ids = itertools.count(FIRST_RUN_ID)

    # --- deploy ------------------------------------------------------------------------------------------------

    def _deployed(self, user: str, overrides: dict[str, str], lookups: dict[str, str]) -> dict:
        """The target's tree with every reference the CLI resolves at deploy resolved."""
        bundle = load_bundle(self.project)
        errors = [str(finding) for finding in bundle.findings if finding.is_error]
        if errors:
            raise PlatformError("the bundle does not load: " + "; ".join(errors))
        tree = bundle.target_tree(self.target)
        name = tree["bundle"]["name"]
        workspace = dict(tree.get("workspace") or {})
        workspace["current_user"] = {"userName": user, "short_name": re.sub(r"[^a-z0-9]+", "_",
                                                                                user.split("@")[0].lower())}
        workspace.setdefault("root_path", f"/Workspace/Users/{user}/.bundle/{name}/{self.target}")
        for key, folder in (("file_path", "files"), ("artifact_path", "artifacts"), ("state_path", "state"),
                            ("resource_path", "resources")):
            workspace.setdefault(key, f"{workspace['root_path']}/{folder}")
        tree["workspace"] = workspace
        for index, (_, job) in enumerate(sorted(tree.get("resources", {}).get("jobs", {}).items())):
            job["id"] = str(1000 + index)  # what ${resources.jobs.<key>.id} resolves to, and the Jobs API's id
        environ = {f"BUNDLE_VAR_{variable}": value for variable, value in overrides.items()}
        variables = target_variables(tree, environ)
        variables.update({name: Variable(name, value, has_value=True) for name, value in lookups.items()})
        resolved = substitute(tree, Resolver(tree, self.target, variables))
        left = sorted({reference.text for reference in _strings_references(resolved)})
        if left:
            raise PlatformError(f"references the deploy would not resolve: {', '.join(left)}")
        return resolved

    # --- runs --------------------------------------------------------------------------------------------------

    def run_job(self, job_key: str, parameters: dict[str, str] | None = None,
                interrupt: Interrupt | None = None) -> JobRun:
        """A new run of the job ("Run now", or its schedule): a new job run id."""
        if job_key not in self.jobs:
            raise PlatformError(f"no job {job_key!r} in this bundle (jobs: {', '.join(sorted(self.jobs))})")
        job = self.jobs[job_key]
        defaults = {item["name"]: str(item["default"]) for item in job.get("parameters", [])}
        unknown = sorted(set(parameters or {}) - set(defaults))
        if unknown:
            raise PlatformError(f"job {job_key} has no parameter {', '.join(unknown)}")
        run = JobRun(job_key, self.job_ids[job_key], next(self._ids), {**defaults, **(parameters or {})})
        self._run_tasks(run, [task["task_key"] for task in job["tasks"]], interrupt)
        return run

    def repair(self, run: JobRun, tasks: list[str] | None = None, interrupt: Interrupt | None = None) -> JobRun:
        """Repair the run under the same job run id: the tasks that did not succeed run again, or the ones named
        (the Jobs API's `rerun_tasks`, which may name tasks that succeeded)."""
        run.repair_count += 1
        to_run = tasks or [task["task_key"] for task in self.jobs[run.job_key]["tasks"]
                           if run.latest(task["task_key"]) is None or run.latest(task["task_key"]).state != SUCCESS]
        self._run_tasks(run, to_run, interrupt)
        return run

    def _run_tasks(self, run: JobRun, task_keys: list[str], interrupt: Interrupt | None) -> None:
        tasks = {task["task_key"]: task for task in self.jobs[run.job_key]["tasks"]}
        for key in _in_dependency_order(tasks):
            if key not in task_keys:
                continue
            task = tasks[key]
            upstream = [dependency["task_key"] for dependency in task.get("depends_on", [])]
            if any(run.latest(name) is None or run.latest(name).state != SUCCESS for name in upstream):
                self._record(run, TaskAttempt(key, next(self._ids), self._attempts(run, key), UPSTREAM_FAILED,
                                              None, ""))
                continue
            for _ in range(1 + int(task.get("max_retries", 0))):
                attempt = self._attempt(run, task, interrupt)
                if attempt.state == SUCCESS:
                    break

    def _attempts(self, run: JobRun, task_key: str) -> int:
        return sum(attempt.task_key == task_key for attempt in run.attempts)

    def _attempt(self, run: JobRun, task: dict, interrupt: Interrupt | None) -> TaskAttempt:
        key, number, task_run_id = task["task_key"], self._attempts(run, task["task_key"]), next(self._ids)
        context = {"job.id": str(run.job_id), "job.run_id": str(run.run_id), "job.repair_count": str(run.repair_count),
                   "task.name": key, "task.run_id": str(task_run_id), "task.execution_count": str(number + 1),
                   **{f"job.parameters.{name}": value for name, value in run.parameters.items()}}
        stop = (lambda: interrupt.when(run)) if interrupt and interrupt.task_key == key and \
            number in interrupt.attempts else None
        if "python_wheel_task" in task:
            command, environ = self._wheel_task(task["python_wheel_task"], context, on_serverless(task))
            mlflow_run = None
        elif "ai_runtime_task" in task:
            command, environ, mlflow_run = self._ai_runtime_task(task["ai_runtime_task"])
        else:
            raise PlatformError(f"task {key}: the harness runs python_wheel_task and ai_runtime_task only")
        attempt = TaskAttempt(key, task_run_id, number, "RUNNING", None, "")
        self._record(run, attempt, mlflow_run)
        scratch = self.root / "driver" / str(run.run_id) / f"{key}-{number}"  # the task's working folder
        scratch.mkdir(parents=True, exist_ok=True)
        attempt.exit_code, attempt.output = _run(command, environ, scratch, stop)
        attempt.state = SUCCESS if attempt.exit_code == 0 else FAILED
        if mlflow_run is not None:
            _end_mlflow_run(self.mlflow_uri, mlflow_run, attempt.state == SUCCESS)
        self._record(run, attempt, mlflow_run)
        return attempt

    def _record(self, run: JobRun, attempt: TaskAttempt, mlflow_run: tuple[str, str] | None = None) -> None:
        """The run as the Jobs API shows it (runs/get lists each task's latest attempt; runs/get-output an AI
        Runtime attempt's MLflow run)."""
        if attempt not in run.attempts:
            run.attempts.append(attempt)
        tasks = {task["task_key"]: task for task in self.jobs[run.job_key]["tasks"]}
        latest = [run.latest(key) for key in tasks if run.latest(key) is not None]
        self.workspace.record_run({
            "job_id": run.job_id, "run_id": run.run_id, "repair_history": [{} for _ in range(run.repair_count)],
            "tasks": [{"task_key": item.task_key, "run_id": item.run_id, "attempt_number": item.attempt,
                       "state": {"life_cycle_state": "RUNNING" if item.state == "RUNNING" else "TERMINATED",
                                 **({} if item.state == "RUNNING" else {"result_state": item.state})},
                       **{kind: tasks[item.task_key][kind] for kind in ("python_wheel_task", "ai_runtime_task")
                          if kind in tasks[item.task_key]}}
                      for item in latest]})
        if mlflow_run is not None:
            experiment_id, mlflow_run_id = mlflow_run
            self.workspace.record_output(attempt.run_id, {"ai_runtime_task_output": {
                "mlflow_experiment_id": experiment_id, "mlflow_run_id": mlflow_run_id}})

    # --- what each kind of task runs ---------------------------------------------------------------------------

    def _base_environment(self) -> dict[str, str]:
        environ = {name: value for name, value in os.environ.items()
                   if not name.startswith(("MLFLOW_", "DATABRICKS_", "PYSPARK_")) and name != "PYTHONPATH"}
        return {**environ, "PYTHONPATH": str(self.project / "src"), "SPARK_LOCAL_IP": "127.0.0.1",
                "MLFLOW_TRACKING_URI": self.mlflow_uri, "MLFLOW_ALLOW_FILE_STORE": "true",  # the server's stand-in
                "DATABRICKS_HOST": self.workspace.url,
                "DATABRICKS_TOKEN": DUMMY_TOKEN,
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}

    def _wheel_task(self, wheel_task: dict, context: dict[str, str],
                    serverless: bool) -> tuple[list[str], dict[str, str]]:
        module, function = self._entry_point(wheel_task["package_name"], wheel_task["entry_point"])
        arguments = self._on_this_machine([_fill(parameter, context) for parameter in wheel_task.get("parameters", [])])
        code = (f"import sys; sys.argv[0] = {wheel_task['entry_point']!r}; "
                f"from {module} import {function} as entry_point; sys.exit(entry_point())")
        environ = self._base_environment()
        if serverless:  # serverless compute's Spark: Spark Connect, and no caching (support/serverless_compute.py)
            code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                    "import serverless_compute; serverless_compute.refuse_caching(); sys.path.pop(0); " + code)
            environ["SPARK_REMOTE"] = serverless_compute.SPARK_REMOTE
        return [sys.executable, "-c", code, *arguments], environ

    def _entry_point(self, package: str, name: str) -> tuple[str, str]:
        import tomllib

        scripts = tomllib.loads((self.project / "pyproject.toml").read_text())["project"].get("scripts", {})
        if name not in scripts:
            raise PlatformError(f"the wheel of {package} has no entry point {name!r} (it has {', '.join(scripts)})")
        module, function = scripts[name].split(":")
        return module, function

    def mlflow(self):
        """An MLflow client of the workspace's tracking server (here, its file store)."""
        return _mlflow(self.mlflow_uri)

    def local_path(self, path: str) -> Path:
        """Where a /Volumes/... path of the workspace lies here."""
        if not path.startswith("/Volumes/"):
            raise PlatformError(f"{path} is not on a volume")
        return self.root / path.lstrip("/")

    def _on_this_machine(self, arguments: list[str]) -> list[str]:
        """Volumes under the root; a GPU request as CPU processes (this machine has no GPU)."""
        mapped = [str(self.local_path(argument)) if argument.startswith("/Volumes/") else argument
                  for argument in arguments]
        result, index = [], 0
        while index < len(mapped):
            if mapped[index] == "--gpus-per-node" and index + 1 < len(mapped):
                if int(mapped[index + 1]) > 0:
                    result += ["--processes", str(self.cpu_processes)]
                index += 2
                continue
            result.append(mapped[index])
            index += 1
        return result

    def _ai_runtime_task(self, task: dict) -> tuple[list[str], dict[str, str], tuple[str, str]]:
        [deployment] = task["deployments"]
        compute = deployment["compute"]
        per_node = {"GPU_1xA10": 1, "GPU_1xH100": 1, "GPU_8xH100": 8}[compute["accelerator_type"]]
        nodes = int(compute["accelerator_count"]) // per_node
        if nodes != 1:
            raise PlatformError(f"the harness runs one node; this task asks for {nodes}")
        file_path = self.tree["workspace"]["file_path"]
        command = deployment["command_path"]
        if not command.startswith(file_path + "/"):
            raise PlatformError(f"command_path {command} is not a file the bundle syncs ({file_path}/...)")
        script = self.project / command[len(file_path) + 1:]
        directory = task.get("mlflow_experiment_directory", f"/Workspace/Users/{self.tree['workspace']['current_user']['userName']}")
        experiment = directory.rstrip("/").removeprefix("/Workspace") + "/" + task["experiment"]
        mlflow_run = _start_mlflow_run(self.mlflow_uri, experiment, task.get("mlflow_run"))
        environ = {**self._base_environment(), "CODE_SOURCE_PATH": str(self.project / task["code_source_path"]),
                   "NODE_RANK": "0", "NUM_NODES": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400",
                   "WORLD_SIZE": str(per_node), "LOCAL_WORLD_SIZE": str(per_node), "MLFLOW_RUN_ID": mlflow_run[1]}
        environ.pop("PYTHONPATH")  # the node has the environment's packages, and the code source
        return ["bash", str(script)], environ, mlflow_run


def on_serverless(task: dict) -> bool:
    """A task on serverless compute: an environment, and no cluster (Jobs API: a task names one or the other)."""
    return "environment_key" in task and not {"job_cluster_key", "new_cluster", "existing_cluster_id"} & set(task)


def _in_dependency_order(tasks: dict[str, dict]) -> list[str]:
    order, seen = [], set()

    def visit(key: str, path: tuple[str, ...]) -> None:
        if key in path:
            raise PlatformError(f"the tasks depend on each other in a cycle: {' -> '.join((*path, key))}")
        if key in seen:
            return
        for dependency in tasks[key].get("depends_on", []):
            visit(dependency["task_key"], (*path, key))
        seen.add(key)
        order.append(key)

    for key in tasks:
        visit(key, ())
    return order


def _fill(text: str, context: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1)
        if name in context:
            return context[name]
        if name.split(".")[0] in KNOWN_NAMESPACES:
            raise PlatformError(f"{match.group(0)}: no such dynamic value reference (the Jobs service refuses an "
                                "invalid reference in a known namespace)")
        return match.group(0)

    return DYNAMIC.sub(value, str(text))


def _strings_references(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings_references(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings_references(item)
    elif isinstance(node, str):
        yield from (reference for reference in references_in(node))


def _run(command: list[str], environ: dict[str, str], cwd: Path, stop: Callable[[], bool] | None) -> tuple[int, str]:
    """The command in a process group of its own; killed (the whole group) once `stop()` holds, or at the bound."""
    log = cwd / "output.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(command, cwd=cwd, env=environ, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        deadline = time.monotonic() + TASK_TIMEOUT
        while process.poll() is None:
            if (stop is not None and stop()) or time.monotonic() > deadline:
                _kill_tree(process.pid)
                process.wait()
                break
            time.sleep(0.05 if stop is not None else 0.2)
    _kill_tree(process.pid)
    return process.returncode, log.read_text(errors="replace")


def _kill_tree(pid: int) -> None:
    """The process, everything it started (torchrun's workers start sessions of their own) and what is left in its
    group: a lost node takes all of them down at once."""
    import psutil

    try:
        doomed = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        doomed = []
    for process in doomed:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _mlflow(uri: str):
    spec = importlib.util.find_spec("mlflow")
    if spec is None:
        raise PlatformError("the AI Runtime opens an MLflow run for each attempt: mlflow must be installed")
    from mlflow import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return MlflowClient(tracking_uri=uri)


def _start_mlflow_run(uri: str, experiment_name: str, run_name: str | None) -> tuple[str, str]:
    client = _mlflow(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(experiment_name)
    return experiment_id, client.create_run(experiment_id, run_name=run_name).info.run_id


def _end_mlflow_run(uri: str, mlflow_run: tuple[str, str], succeeded: bool) -> None:
    _mlflow(uri).set_terminated(mlflow_run[1], "FINISHED" if succeeded else "FAILED")


def sample_tables(spark, project: Path, folder: Path, seed: int = 42) -> dict[str, str]:
    """The workspace's tables, here: the project's task's sample (and the taxi trips Spark ML reads) as parquet
    folders, named by the bundle variables a job takes its tables from."""
    from distributed_training.config import Config
    from distributed_training.engines.spark_ml_connect import ENGINE as SPARK_ML

    [task_file] = (Path(project) / "src").glob("*/task.py")
    name = f"task_of_{abs(hash(str(task_file)))}"
    spec = importlib.util.spec_from_file_location(name, task_file)
    task = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up there
    spec.loader.exec_module(task)
    tables = {"training_table": task.sample_table(spark, seed),
              "spark_ml_table": SPARK_ML.sample_table(spark, Config(engine=SPARK_ML.name, seed=seed))}
    paths = {}
    for variable, table in tables.items():
        paths[variable] = str(Path(folder) / variable)
        table.coalesce(1).write.mode("overwrite").parquet(paths[variable])
    return paths
