"""`run JOB_KEY [--target T]`: run a job the bundle deployed, follow it to its end, exit with its result.

Exit codes: 0 the run succeeded (result SUCCESS); 1 it ended otherwise (failed, timed out, cancelled, skipped,
succeeded with failures); 2 it could not be started or followed (no bundle here, unknown target, job not found,
authentication or API error); 124 the --timeout wait ended while the run goes on; 130 interrupted with Ctrl-C
(the run cancelled, or left running when you said so).

Every wait is bounded, from the first request (the SDK's own, made while it reads its configuration): a host that
never answers is given --connect-timeout seconds in all, a workspace that answers only with errors --api-patience
seconds (see `connection`). The job key is checked against the bundle before any request, and so is whether there
are credentials at all (see `credentials`).

Authentication is the Databricks SDK's own: a profile (--profile, else the target's workspace.profile, else
DEFAULT in ~/.databrickscfg), DATABRICKS_* environment variables, OAuth. No token is read from or written to any
file of the bundle.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import math
import sys
import uuid

from ...config import bounded

EXIT_SUCCEEDED = 0
EXIT_RUN_FAILED = 1
EXIT_ERROR = 2
EXIT_STILL_RUNNING = 124
EXIT_INTERRUPTED = 130
# How long the SDK itself retries one call (429, 503, dropped connections): its default, 300 s, would hold a poll
# (and --timeout) for five minutes; `Patience` takes over after this. Never more than --api-patience.
SDK_RETRY_SECONDS = 60
# How long one request waits for its answer (the SDK's default is 60 s). Never more than --api-patience.
SDK_HTTP_SECONDS = 60
# How long a host that has not answered yet is given, from the first request, before `run` gives up on it.
CONNECT_SECONDS = 45


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_key", metavar="JOB_KEY", help="the job's key under resources.jobs, e.g. train_ray")
    parser.add_argument("--target", "-t", metavar="T", help="the bundle target it was deployed to (default: the "
                        "bundle's default target)")
    parser.add_argument("--bundle-dir", default=".", metavar="DIR",
                        help="the folder that holds databricks.yml (default: the current folder)")
    parser.add_argument("--profile", "-p", help="a profile of ~/.databrickscfg (default: the target's "
                        "workspace.profile, else the SDK's default authentication)")
    parser.add_argument("--param", action="append", type=_parameter, default=[], metavar="KEY=VALUE",
                        help="a job parameter for this run (repeatable), e.g. --param epochs=3")
    parser.add_argument("--no-wait", action="store_true", help="start the run, print its page, and return")
    parser.add_argument("--timeout", type=positive_seconds, metavar="SECONDS",
                        help=f"stop waiting after this long (the run goes on; exit code {EXIT_STILL_RUNNING})")
    parser.add_argument("--poll-interval", type=positive_seconds, default=5.0, metavar="SECONDS",
                        help="seconds between two reads of the run's state (default 5)")
    parser.add_argument("--api-patience", type=positive_seconds, default=600.0, metavar="SECONDS",
                        help="how long to keep retrying while the workspace answers only with transient errors "
                             "(5xx, 429) or stops answering, before giving up (default 600)")
    parser.add_argument("--connect-timeout", type=positive_seconds, default=float(CONNECT_SECONDS),
                        metavar="SECONDS", help="how long to wait for the workspace's first answer (a wrong host, "
                        f"a network that does not reach it) before giving up (default {CONNECT_SECONDS})")


def _parameter(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. --param epochs=3)")
    return key.strip(), value


positive_seconds = bounded(float, 0, low_open=True, unreadable="{text!r} is not a number of seconds",
                           not_finite="{text!r}: give a finite number of seconds",
                           too_low="{text!r}: give a number of seconds above 0")


def run(args: argparse.Namespace) -> int:
    try:
        from databricks.sdk.errors import DatabricksError
    except ImportError:
        print("error: `run` talks to the workspace through the Databricks SDK, which is not installed here\n"
              "fix: pip install 'databricks-sdk>=0.60'", file=sys.stderr)
        return EXIT_ERROR

    from ..bundle.loader import NotABundle
    from .credentials import CannotAuthenticate
    from .deployment import DeploymentError, check_job_key, find_deployed_job, read_bundle_target
    from .retry_policy import Patience, WorkspaceUnavailable
    from .progress import ProgressLine

    out = sys.stdout
    progress = ProgressLine(out, interactive=out.isatty())

    def note(message: str) -> None:
        progress.end_line()
        out.write(f"note: {message}\n")
        out.flush()

    patience = Patience(interval=args.poll_interval, give_up_after=args.api_patience, note=note)
    try:
        bundle = read_bundle_target(args.bundle_dir, args.target)
        check_job_key(bundle, args.job_key)  # before any request: a typo costs no wait
        workspace = _workspace_client(args.profile or bundle.profile, connect_seconds=args.connect_timeout,
                                      patience_seconds=args.api_patience)
        job = find_deployed_job(workspace.jobs, bundle, args.job_key, patience,
                                lambda: _current_user(workspace, patience), note)
        run_id = _start(workspace.jobs, job, dict(args.param), patience)
    except NotABundle as error:
        return _fail(f"{error}; fix: run it from the bundle's folder, or pass --bundle-dir DIR")
    except (DeploymentError, CannotAuthenticate, WorkspaceUnavailable) as error:
        return _fail(error)
    except DatabricksError as error:
        return _fail(_with_fix(error))
    except KeyboardInterrupt:
        print("\ninterrupted before the run was confirmed started: check the job's runs in the workspace",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    out.write(f"started run {run_id} of job {job.name!r} (id {job.job_id}, from {job.found_in}), "
              f"target {bundle.target}\n")
    try:
        if args.no_wait:
            return _show_run_page(workspace.jobs, run_id, patience)
        return _follow_to_the_end(workspace.jobs, run_id, args, patience, progress)
    except (WorkspaceUnavailable, DatabricksError) as error:
        progress.end_line()
        return _fail(_with_fix(error),
                     f"run {run_id} may still be going: see its page in the workspace's Jobs & Pipelines")


def _workspace_client(profile: str | None, *, connect_seconds: float = CONNECT_SECONDS,
                      patience_seconds: float = 600.0):
    """A client whose every request, the SDK's first included, waits no longer than the options allow."""
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.config import Config

    from .connection import WorkspaceLink
    from .credentials import LOGIN_FIX, CannotAuthenticate, check_credentials

    _quiet_sdk_logs()
    reach = min(connect_seconds, patience_seconds)
    options = {"retry_timeout_seconds": max(1, math.ceil(min(SDK_RETRY_SECONDS, patience_seconds))),
               "http_timeout_seconds": min(SDK_HTTP_SECONDS, patience_seconds, max(reach, 1.0))}
    if "http_adapter" in inspect.signature(Config.__init__).parameters:  # databricks-sdk 0.120+
        options["http_adapter"] = WorkspaceLink(reach_seconds=reach, patience_seconds=patience_seconds)
    try:
        check_credentials(profile)  # before the SDK's first request: nothing to authenticate with costs no wait
        config = Config(profile=profile, **options)
    except ValueError as error:
        reason = " ".join(str(error).split())
        raise CannotAuthenticate(f"cannot authenticate to the workspace: {reason}; fix: "
                                 + LOGIN_FIX.format(config_file="~/.databrickscfg")) from error
    return WorkspaceClient(config=config)


def _quiet_sdk_logs() -> None:
    """The SDK logs a warning when its first request fails, and Python prints it when nothing handles logs: `run`
    says what went wrong itself, in one line. Logging configured by the caller still gets the SDK's records.

    Where nothing is configured, the SDK's records also stop here: the SDK configures the root logger itself the
    first time it runs the Databricks CLI (a module-level `logging.debug`), which would print its later warnings.
    """
    logger = logging.getLogger("databricks.sdk")
    if not any(isinstance(handler, logging.NullHandler) for handler in logger.handlers):
        logger.addHandler(logging.NullHandler())
        logger.propagate = bool(logging.getLogger().handlers)


def _current_user(workspace, patience) -> str | None:
    from databricks.sdk.errors import DatabricksError

    try:
        return patience.call("reading the current user", workspace.current_user.me).user_name
    except DatabricksError:
        return None


def _start(jobs, job, parameters: dict[str, str], patience) -> int:
    # The token makes run-now safe to send again after a transient error: the service starts one run per token.
    token = str(uuid.uuid4())
    started = patience.call(f"starting job {job.job_id}", jobs.run_now, job.job_id,
                            job_parameters=parameters or None, idempotency_token=token)
    return started.run_id


def _show_run_page(jobs, run_id: int, patience) -> int:
    run = patience.call(f"reading run {run_id}", jobs.get_run, run_id)
    sys.stdout.write(f"run page: {run.run_page_url}\n(not waiting: follow it there, or cancel it with "
                     f"`databricks jobs cancel-run {run_id}`)\n")
    return EXIT_SUCCEEDED


def _follow_to_the_end(jobs, run_id: int, args, patience, progress) -> int:
    from .follow import RunFollower
    from .report import report_finished
    from .run_state import phase

    out = sys.stdout
    follower = RunFollower(jobs, run_id, patience=patience, progress=progress, poll_interval=args.poll_interval,
                           timeout=args.timeout)
    while True:
        try:
            followed = follower.follow()
            break
        except KeyboardInterrupt:
            progress.end_line()
            decision = _ask_to_cancel(run_id)
            if decision is None:
                out.write(f"\nleft run {run_id} running: {follower.url or 'see the job page'}\n")
                return EXIT_INTERRUPTED
            if decision:
                patience.call(f"cancelling run {run_id}", jobs.cancel_run, run_id)
                out.write(f"cancel requested for run {run_id}; it ends as CANCELED: {follower.url or ''}\n")
                return EXIT_INTERRUPTED
            out.write("following the run again\n")
    if not followed.finished:
        state = phase(followed.run).word if followed.run else "not read yet"
        out.write(f"gave up waiting after {args.timeout:g} s (--timeout): run {run_id} is still going ({state}) in "
                  f"the workspace: {follower.url or 'see the job page'}\n"
                  f"cancel it with `databricks jobs cancel-run {run_id}`\n")
        return EXIT_STILL_RUNNING
    report_finished(followed.run, follower.elapsed, jobs, patience, out)
    return EXIT_SUCCEEDED if phase(followed.run).succeeded else EXIT_RUN_FAILED


def _ask_to_cancel(run_id: int) -> bool | None:
    """True: cancel the run; False: keep following; None: stop following and leave the run going.

    Without a terminal to ask on (a CI job, a pipe), an interrupt cancels: nobody is left to watch the run.
    """
    if not sys.stdin.isatty():
        sys.stdout.write(f"interrupted, with no terminal to ask on: cancelling run {run_id}\n")
        return True
    try:
        answer = input(f"cancel run {run_id}? [y/N] (Ctrl-C again: stop following and leave it running) ")
    except (KeyboardInterrupt, EOFError):
        return None
    return answer.strip().lower() in {"y", "yes"}


def _with_fix(error: BaseException) -> str:
    """The workspace's refusal in one line, with what to do about it."""
    from databricks.sdk.errors import DatabricksError, PermissionDenied, Unauthenticated

    text = " ".join(str(error).split())
    if not isinstance(error, DatabricksError):
        return text
    if isinstance(error, Unauthenticated):
        fix = ("check the token or profile (DATABRICKS_TOKEN, --profile) or log in again: "
               "`databricks auth login --host https://<workspace>`")
    elif isinstance(error, PermissionDenied):
        fix = "ask for CAN MANAGE RUN on the job, or run it as its owner"
    else:
        fix = "check the job in the workspace (Jobs & Pipelines), then run again"
    return f"the workspace refused: {text}; fix: {fix}"


def _fail(error: BaseException, after: str | None = None) -> int:
    sys.stdout.flush()
    print(f"error: {error}" + (f" ({after})" if after else ""), file=sys.stderr)
    return EXIT_ERROR
