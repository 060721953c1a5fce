"""The typed classes' fast path (`plainly_parses`): a job it passes is one `from_dict` accepts, so a job it spares
from the parse could never have had a finding. Shown on the jobs every answer combination renders and on thousands
of them broken at random (a value of another kind, a key removed or added), and on the cases where
`databricks-bundles` is lenient or strict in ways easy to get wrong."""

from __future__ import annotations

import copy
import random

import pytest

from distributed_training.tooling.bundle.field_kinds import plainly_parses
from distributed_training.tooling.bundle.loader import load_bundle

Job = pytest.importorskip("databricks.bundles.jobs").Job
REPLACEMENTS = [None, "x", "", 0, 7, -1, True, False, 1.5, "${var.some_value}", "${var.a} and more", "$${var.a}", {},
                [], {"unknown_key": 1}, [{"task_key": "k"}], "ALL_SUCCESS", "SOMETIMES", "5", "yes", "PAUSED",
                {"task_key": "k"}]


def parses(job) -> bool:
    try:
        Job.from_dict(copy.deepcopy(job))
        return True
    except (ValueError, TypeError, KeyError, AttributeError):
        return False


@pytest.fixture(scope="module")
def rendered_jobs(tmp_path_factory, render_into):
    jobs = []
    for index, answers in enumerate([{"engine": "all"}, {"engine": "all", "task": "causal_lm"},
                                     {"compute": "serverless_gpu", "engine": "deepspeed"},
                                     {"engine": "spark_ml_connect"}]):
        project = render_into(tmp_path_factory.mktemp(f"project{index}") / "out", **answers)
        bundle = load_bundle(project)
        for target in ("dev", "prod"):
            jobs += list(bundle.target_tree(target)["resources"]["jobs"].values())
    return jobs


def test_every_rendered_job_takes_the_fast_path_and_parses(rendered_jobs):
    assert len(rendered_jobs) >= 20
    for job in rendered_jobs:
        assert plainly_parses(Job, job), job
        assert parses(job)


def leaves(node, path=()):
    """Every (path, value) below a job, containers included."""
    yield path, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield from leaves(value, (*path, key))


def replaced(job, path, value):
    job = copy.deepcopy(job)
    *parents, last = path
    node = job
    for part in parents:
        node = node[part]
    node[last] = value
    return job


def removed(job, path):
    job = copy.deepcopy(job)
    *parents, last = path
    node = job
    for part in parents:
        node = node[part]
    del node[last]
    return job


def test_a_job_broken_at_random_takes_the_fast_path_only_where_from_dict_accepts_it(rendered_jobs):
    chance = random.Random(20261206)
    fast = slow = 0
    for _ in range(4000):
        job = chance.choice(rendered_jobs)
        path, _ = chance.choice([leaf for leaf in leaves(job) if leaf[0]])
        if chance.random() < 0.2 and isinstance(path[-1], str):
            broken = removed(job, path)
        else:
            broken = replaced(job, path, copy.deepcopy(chance.choice(REPLACEMENTS)))
        if plainly_parses(Job, broken):
            fast += 1
            assert parses(broken), (path, broken)
        else:
            slow += 1
    assert fast > 500 and slow > 500, (fast, slow)  # both ways taken often


@pytest.mark.parametrize("change, fast, accepted", [
    ({"timeout_seconds": "${var.timeout}"}, True, True),  # a reference where an int goes
    ({"timeout_seconds": "5"}, False, True),  # int("5"): the parse decides
    ({"timeout_seconds": "five"}, False, False),
    ({"timeout_seconds": True}, False, True),  # int(True)
    ({"max_concurrent_runs": 2.5}, False, True),  # int(2.5): lenient, and left to it
    ({"name": 12}, True, True),  # str(12)
    ({"tasks": "a task"}, False, False),
    ({"tasks": None}, True, True),  # an empty list
    ({"tasks": [{"notebook_task": {"notebook_path": "x"}}]}, False, False),  # task_key is required
    ({"tasks": [{"task_key": "t", "run_if": "SOMETIMES"}]}, False, False),
    ({"tasks": [{"task_key": "t", "run_if": "ALL_DONE"}]}, True, True),
    ({"tasks": [{"task_key": "t", "disabled": "yes"}]}, False, True),  # the CLI's YAML 1.1 booleans
    ({"tasks": [{"task_key": "t", "unknown": 1}]}, False, False),
    ({"tags": {"team": "ml", "cost": 3}}, True, True),
    ({"tags": ["team"]}, False, False),
    ({"email_notifications": "${var.notifications}"}, True, True),
    ({"email_notifications": "${var.a} ${var.b}"}, False, False),  # not one whole reference
    ({"cls": 1}, False, False),
])
def test_the_fast_path_follows_the_parse_where_it_is_lenient_or_strict(change, fast, accepted):
    job = {"name": "job", "tasks": [{"task_key": "t", "existing_cluster_id": "abc"}], **change}
    assert parses(job) is accepted
    assert plainly_parses(Job, job) is fast
