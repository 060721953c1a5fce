"""A stand-in for a Databricks workspace's Jobs API 2.2, served over real HTTP on 127.0.0.1, for tests of `run`.

It stands in for the workspace that `databricks bundle deploy` deployed to, for the calls the `run` command makes
through the real `databricks-sdk` `WorkspaceClient` (host=http://127.0.0.1:PORT, any token):
  GET  /api/2.2/jobs/list              jobs with their settings (name, tags), paginated by page_token
  GET  /api/2.2/jobs/get               one job; 400 INVALID_PARAMETER_VALUE "Job N does not exist." otherwise
  POST /api/2.2/jobs/run-now           starts a run (job_parameters recorded; one run per idempotency_token)
  GET  /api/2.2/jobs/runs/get          the run's `state` and `status`, each task's, run_page_url
  GET  /api/2.2/jobs/runs/get-output   a task run's error, error_trace, logs
  POST /api/2.2/jobs/runs/cancel       the run then reads as TERMINATED / CANCELED
  GET  /api/2.0/preview/scim/v2/Me     the current user
  GET  /.well-known/databricks-config  the host metadata the SDK reads when it is built (no token needed)
and 404 ENDPOINT_NOT_FOUND to anything else. /api/ calls need `Authorization: Bearer <DUMMY_TOKEN>`.

What a run does is scripted: `ScriptedRun.snapshots` are what runs/get answers, one per call, the last repeating.
Or it is recorded as it happens (`record_run`, `record_output`): the local platform of `local_platform.py` runs a
bundle's jobs for real and writes each job run and task run here, so that code running in a task can ask the Jobs
API about its own run, as it would on the workspace.
Transient failures are queued per path with `fail_next`, answers that never come (until the fake closes) with
`stall_next`. Every request is recorded in `requests`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

RESULT_STATES = {"SUCCESS", "FAILED", "TIMEDOUT", "CANCELED", "SUCCESS_WITH_FAILURES", "UPSTREAM_FAILED",
                 "UPSTREAM_CANCELED", "EXCLUDED", "DISABLED", "MAXIMUM_CONCURRENT_RUNS_REACHED"}
# `state.life_cycle_state` -> `status.state` (the newer field's spelling)
STATUS_STATE = {"SKIPPED": "TERMINATED", "INTERNAL_ERROR": "TERMINATED", "WAITING_FOR_RETRY": "WAITING"}
# `state.result_state` -> `status.termination_details.code`
TERMINATION_CODE = {"FAILED": "RUN_EXECUTION_ERROR", "TIMEDOUT": "RUN_EXECUTION_ERROR", "CANCELED": "USER_CANCELED",
                    "UPSTREAM_FAILED": "RUN_EXECUTION_ERROR", "UPSTREAM_CANCELED": "CANCELED"}
DUMMY_TOKEN = "dummy-token"
WORKSPACE_ID = "1234567890"  # the only token the fake accepts: tests give it to the SDK
# A bundle with one job, as `run` reads it, and the tags the fake workspace finds that job by.
DEMO_BUNDLE = """\
bundle:
  name: demo
targets:
  dev:
    mode: development
    default: true
  prod:
    mode: production
resources:
  jobs:
    train_ray:
      name: demo-ray
      tags: {bundle: "${bundle.name}", job_key: train_ray, target: "${bundle.target}"}
"""
DEMO_TAGS = {"bundle": "demo", "job_key": "train_ray", "target": "dev"}
ERROR_CODES = {500: "INTERNAL_ERROR", 502: "BAD_GATEWAY", 503: "TEMPORARILY_UNAVAILABLE",
               429: "REQUEST_LIMIT_EXCEEDED", 504: "DEADLINE_EXCEEDED"}


@dataclass(frozen=True)
class Snapshot:
    """A run as one runs/get call sees it. Task values: a life cycle state (RUNNING) or a result (FAILED)."""
    life_cycle: str
    result: str | None = None
    message: str = ""
    tasks: dict[str, str] = field(default_factory=dict)


def snapshot(state: str, message: str = "", **tasks: str) -> Snapshot:
    """`snapshot("RUNNING", train="RUNNING")`, `snapshot("FAILED", train="FAILED")`: a result means TERMINATED."""
    if state in RESULT_STATES:
        return Snapshot("TERMINATED", state, message, tasks)
    return Snapshot(state, None, message, tasks)


@dataclass
class ScriptedRun:
    snapshots: list[Snapshot]
    outputs: dict[str, dict] = field(default_factory=dict)  # task key -> extra fields of its runs/get-output


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: dict


@dataclass
class _Run:
    run_id: int
    job_id: int
    script: ScriptedRun
    task_run_ids: dict[str, int]
    started_ms: int
    reads: int = 0
    cancelled: bool = False


class FakeWorkspace:
    def __init__(self, *, user: str = "someone@example.com", include_state: bool = True):
        self.user = user
        self.include_state = include_state  # False: runs carry only the newer `status` field
        self.jobs: dict[int, dict] = {}
        self.requests: list[Request] = []
        self._scripts: list[ScriptedRun] = []
        self._failures: dict[str, list[int]] = {}
        self._stalls: dict[str, int] = {}
        self.closing = threading.Event()  # set on exit: stalled answers end then
        self._runs: dict[int, _Run] = {}
        self._task_runs: dict[int, tuple[_Run, str]] = {}
        self._runs_by_token: dict[str, int] = {}
        self._next_id = 1000
        self._recorded_runs: dict[int, dict] = {}  # job run id -> runs/get's answer
        self._recorded_outputs: dict[int, dict] = {}  # task run id -> runs/get-output's answer
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeWorkspace":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()

    # --- what the tests set up -------------------------------------------------------------------------------

    def add_job(self, job_id: int, name: str, tags: dict[str, str] | None = None,
                creator: str | None = None, tasks: tuple[str, ...] = ("train",)) -> None:
        self.jobs[job_id] = {
            "job_id": job_id,
            "creator_user_name": creator or self.user,
            "created_time": 1_700_000_000_000 + job_id,
            "settings": {"name": name, "tags": tags or {}, "max_concurrent_runs": 1, "format": "MULTI_TASK",
                         "tasks": [{"task_key": key} for key in tasks]},
        }

    def record_run(self, run: dict) -> None:
        """A job run as runs/get answers it (its `run_id`, `job_id`, `tasks`: each with `task_key`, `run_id`, ...)."""
        with self._lock:
            self._recorded_runs[int(run["run_id"])] = run

    def record_output(self, task_run_id: int, output: dict) -> None:
        """What runs/get-output answers for a task run (beside its metadata)."""
        with self._lock:
            self._recorded_outputs[int(task_run_id)] = output

    def script_runs(self, *scripts: ScriptedRun) -> None:
        """What the next runs started by run-now do, in order."""
        self._scripts.extend(scripts)

    def fail_next(self, path: str, *statuses: int) -> None:
        """Answer the next requests to `path` with these HTTP statuses, one each, before answering normally."""
        self._failures.setdefault(path, []).extend(statuses)

    def stall_next(self, path: str, times: int = 1_000_000) -> None:
        """Read the next `times` requests to `path` and send nothing back (until the fake closes)."""
        self._stalls[path] = self._stalls.get(path, 0) + times

    def take_stall(self, path: str) -> bool:
        with self._lock:
            if self._stalls.get(path, 0) > 0:
                self._stalls[path] -= 1
                self.requests.append(Request("STALLED", path, {}, {}))
                return True
            return False

    @property
    def last_run(self) -> tuple[int, dict[str, int]]:
        """The run run-now started last: its id, and its tasks' run ids by task key."""
        run = self._runs[max(self._runs)]
        return run.run_id, dict(run.task_run_ids)

    def calls(self, path: str) -> list[Request]:
        return [request for request in self.requests if request.path == path]

    # --- the API ---------------------------------------------------------------------------------------------

    def answer(self, method: str, path: str, query: dict[str, str], body: dict,
               authorization: str | None) -> tuple[int, dict]:
        with self._lock:
            self.requests.append(Request(method, path, query, body))
            if path.startswith("/api/") and authorization != f"Bearer {DUMMY_TOKEN}":
                return 401, {"error_code": "UNAUTHENTICATED", "message": "Invalid access token."}
            queued = self._failures.get(path)
            if queued:
                status = queued.pop(0)
                return status, {"error_code": ERROR_CODES.get(status, "UNKNOWN"),
                                "message": f"the fake workspace answers {status} this once"}
            route = {
                ("GET", "/api/2.2/jobs/list"): self._list_jobs,
                ("GET", "/api/2.2/jobs/get"): self._get_job,
                ("POST", "/api/2.2/jobs/run-now"): self._run_now,
                ("GET", "/api/2.2/jobs/runs/get"): self._get_run,
                ("GET", "/api/2.2/jobs/runs/get-output"): self._get_run_output,
                ("POST", "/api/2.2/jobs/runs/cancel"): self._cancel_run,
                ("GET", "/api/2.0/preview/scim/v2/Me"): self._me,
                ("GET", "/.well-known/databricks-config"): self._host_metadata,
            }.get((method, path))
            if route is None:
                return 404, {"error_code": "ENDPOINT_NOT_FOUND", "message": f"No API found for '{method} {path}'"}
            return route(query, body)

    def _list_jobs(self, query, body):
        limit = int(query.get("limit", 20))
        offset = int(query.get("page_token", 0))
        jobs = sorted(self.jobs.values(), key=lambda job: -job["created_time"])
        answer = {"jobs": jobs[offset:offset + limit], "has_more": offset + limit < len(jobs)}
        if answer["has_more"]:
            answer["next_page_token"] = str(offset + limit)
        return 200, answer

    def _get_job(self, query, body):
        job_id = int(query["job_id"])
        if job_id not in self.jobs:
            return _no_such_job(job_id)
        return 200, self.jobs[job_id]

    def _run_now(self, query, body):
        job_id = int(body["job_id"])
        if job_id not in self.jobs:
            return _no_such_job(job_id)
        token = body.get("idempotency_token")
        if token in self._runs_by_token:
            run_id = self._runs_by_token[token]
            return 200, {"run_id": run_id, "number_in_job": run_id}
        script = self._scripts.pop(0) if self._scripts else ScriptedRun([snapshot("SUCCESS", train="SUCCESS")])
        run_id = self._new_id()
        task_keys = {key for shot in script.snapshots for key in shot.tasks}
        run = _Run(run_id, job_id, script, {key: self._new_id() for key in sorted(task_keys)},
                   int(time.time() * 1000))
        self._runs[run_id] = run
        for key, task_run_id in run.task_run_ids.items():
            self._task_runs[task_run_id] = (run, key)
        if token:
            self._runs_by_token[token] = run_id
        return 200, {"run_id": run_id, "number_in_job": run_id}

    def _get_run(self, query, body):
        if int(query["run_id"]) in self._recorded_runs:
            return 200, self._recorded_runs[int(query["run_id"])]
        run = self._runs.get(int(query["run_id"]))
        if run is None:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Run {query['run_id']} does not exist."}
        shot = run.script.snapshots[min(run.reads, len(run.script.snapshots) - 1)]
        run.reads += 1
        if run.cancelled:
            shot = Snapshot("TERMINATED", "CANCELED", "Run cancelled.",
                            {key: "CANCELED" for key in run.task_run_ids})
        return 200, self._run_json(run, shot)

    def _get_run_output(self, query, body):
        run_id = int(query["run_id"])
        if run_id in self._recorded_outputs:
            return 200, {"metadata": {"run_id": run_id}, **self._recorded_outputs[run_id]}
        if run_id in self._runs or run_id in self._recorded_runs:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "Retrieving the output of runs with "
                         "multiple tasks is not supported. Please retrieve the output of each individual task run "
                         "instead."}
        if run_id not in self._task_runs:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Run {run_id} does not exist."}
        run, key = self._task_runs[run_id]
        return 200, {"metadata": {"run_id": run_id, "job_id": run.job_id, "task_key": key},
                     **run.script.outputs.get(key, {})}

    def _cancel_run(self, query, body):
        run = self._runs.get(int(body["run_id"]))
        if run is None:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Run {body['run_id']} does not exist."}
        run.cancelled = True
        return 200, {}

    def _host_metadata(self, query, body):
        return 200, {"oidc_endpoint": f"{self.url}/oidc", "workspace_id": WORKSPACE_ID, "cloud": "aws"}

    def _me(self, query, body):
        return 200, {"id": "1", "userName": self.user, "active": True}

    # --- answers' shapes -------------------------------------------------------------------------------------

    def _run_json(self, run: _Run, shot: Snapshot) -> dict:
        page_url = f"{self.url}/jobs/{run.job_id}/runs/{run.run_id}"
        tasks = []
        for key, task_run_id in run.task_run_ids.items():
            value = shot.tasks.get(key, "PENDING")
            task_shot = snapshot(value)
            tasks.append({"task_key": key, "run_id": task_run_id, "attempt_number": 0,
                          "start_time": run.started_ms, "run_page_url": f"{page_url}/tasks/{task_run_id}",
                          **self._state_fields(task_shot)})
        return {"job_id": run.job_id, "run_id": run.run_id, "number_in_job": run.run_id,
                "run_name": self.jobs[run.job_id]["settings"]["name"], "run_type": "JOB_RUN",
                "start_time": run.started_ms, "run_page_url": page_url, "tasks": tasks,
                **self._state_fields(shot)}

    def _state_fields(self, shot: Snapshot) -> dict:
        state = {"life_cycle_state": shot.life_cycle, "state_message": shot.message,
                 "user_cancelled_or_timedout": shot.result == "CANCELED"}
        if shot.result:
            state["result_state"] = shot.result
        status = {"state": STATUS_STATE.get(shot.life_cycle, shot.life_cycle)}
        if status["state"] == "TERMINATED":
            status["termination_details"] = {"code": TERMINATION_CODE.get(shot.result or "", shot.result or "SUCCESS"),
                                             "type": "SUCCESS" if shot.result == "SUCCESS" else "CLIENT_ERROR",
                                             "message": shot.message}
        return {"state": state, "status": status} if self.include_state else {"status": status}

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id


def _no_such_job(job_id: int) -> tuple[int, dict]:
    return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Job {job_id} does not exist."}


def _handler_for(workspace: FakeWorkspace):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def _answer(self) -> None:
            url = urlparse(self.path)
            query = {key: values[-1] for key, values in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            if workspace.take_stall(url.path):
                workspace.closing.wait()
                return
            status, answer = workspace.answer(self.command, url.path, query, body, self.headers.get("Authorization"))
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status in (429, 503):
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args) -> None:  # keep the test output clean
            pass

    return Handler
