"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import sys

import pytest

# OpenMP's threads wait for work asleep, not spinning: torch in a test process takes a thread per core, and the
# suite runs a pytest-xdist worker per core, so two spinning threads take each other's core (measured at a load
# average of 4: a small matrix multiply's forward and backward 11 times slower, in CPU time as in wall time). Set
# before anything imports torch; every process the tests start inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(items):
    """The engine tests first, in their order, then the rest: with a pytest-xdist worker per core (scripts/test.sh),
    the long runs start early and the many short tests fill in around them, instead of the run ending on one long
    test while the other worker waits."""
    items.sort(key=lambda item: item.get_closest_marker("engine") is None)


# Modules whose module-scoped fixtures are dear (a venv with torch and DeepSpeed installed; two Spark ML runs started
# at once; DDP ranks' weights that several comparisons share; staged fine-tuning data and a LoRA run): each runs on one
# pytest-xdist worker, or every worker that takes one of its tests pays for the fixture again. xdist's own
# `xdist_group` mark cannot say this under pytest 9, which ignores the group suffix xdist writes into a test's id.
ONE_WORKER_MODULES = ("tests/template/test_generated_project.py", "tests/engines/test_spark_ml_connect.py",
                      "tests/engines/test_distributed_equivalence.py", "tests/engines/test_fine_tune_equivalence.py",
                      "tests/unit/test_fine_tune.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (scripts/test.sh): a test a unit of work, except the modules above, a unit each."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    missing = [module for module in ONE_WORKER_MODULES if not (config.rootpath / module).is_file()]
    assert not missing, f"ONE_WORKER_MODULES names modules that are not there: {missing}"

    class OneWorkerModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.partition("::")[0]
            return module if module in ONE_WORKER_MODULES else nodeid

    return OneWorkerModules(config, log)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """A real local Spark session for the whole test session (a worker's), stopped at the end: the one `train --local`
    starts, on two cores, because distributed tests run two processes, with its own warehouse folder, so no test
    writes into the working directory.
    """
    from distributed_training.engines.local_spark import local_spark_session

    session = local_spark_session(cores=2, warehouse_dir=str(tmp_path_factory.mktemp("spark-warehouse")))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory):
    """Small pretrained models made here (support/pretrained.py), by family: "llama" and "gpt2", made once a session."""
    from support.pretrained import pretrained_model

    made = {}

    def folder_of(family: str) -> str:
        if family not in made:
            made[family] = pretrained_model(str(tmp_path_factory.mktemp(f"pretrained-{family}")), family)
        return made[family]

    return folder_of


# DeepSpeed's CPU op from scratch: under a minute on 2 quiet cores, 2.5 to 3 at a load average of 8, 8 at 13. It runs
# inside the per-test timeout (pyproject.toml) of the first test that needs it.
OP_BUILD_BOUND_S = 1500


@pytest.fixture(scope="session")
def deepspeed_cpu_op(tmp_path_factory) -> str:
    """A torch extensions folder (what TORCH_EXTENSIONS_DIR names) holding DeepSpeed's CPU communication op, built
    once per test session under a generous bound, so that no test pays for the build inside its own bounds.

    The session's own folder, not torch's default (~/.cache/torch_extensions/py311_cpu), which every interpreter of
    the machine shares: another virtual environment that uses DeepSpeed (a generated project's, another checkout's)
    rebuilds the op there for its own paths, so what a test finds there may be built for somewhere else, or locked
    by a build in progress. With several pytest-xdist workers, the folder is the run's, shared by them: the first
    builds the op, the others wait on torch's lock and find it built."""
    from distributed_training.engines.deepspeed import build_cpu_communication_op

    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = str(tmp_path_factory.getbasetemp().parent / "torch_extensions")  # the workers' common folder
    else:
        folder = str(tmp_path_factory.mktemp("torch_extensions"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", folder)
        patch.setenv("PATH", _interpreter_first_on_path())
        build_cpu_communication_op(timeout=OP_BUILD_BOUND_S)
    return folder


def _interpreter_first_on_path() -> str:
    """PATH with this interpreter's folder first, as the processes the tests start have it: torch builds with the
    first `ninja` on PATH, and a build log written by another ninja version (the venv's pip `ninja` 1.13 against the
    system's 1.11) is discarded, so the whole op builds again."""
    return os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])


@pytest.fixture
def deepspeed_op_built(deepspeed_cpu_op, monkeypatch) -> str:
    """For tests that run DeepSpeed on CPU: this test and every process it starts find the op built already (the
    session's folder), as a second run on a cluster does. Returns the op's own folder."""
    from distributed_training.engines.deepspeed import _extension_folder

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", deepspeed_cpu_op)
    monkeypatch.setenv("PATH", _interpreter_first_on_path())  # the ninja that built it: nothing builds again
    return _extension_folder()


@pytest.fixture
def no_spark_starts(monkeypatch):
    """`train` refused or done before anything started: the test fails where a run would start its Spark session
    (a local one, or the cluster's), which comes before staging and any training process. Wall time cannot say
    this on a busy machine: starting Spark costs seconds on 2 quiet cores, and a refusal can take as long on 2 busy
    ones."""
    from distributed_training import launch

    def started(*_args, **_kwargs):
        pytest.fail("a Spark session was started: the refusal must come before it", pytrace=False)

    monkeypatch.setattr(launch, "_local_session", started)
    monkeypatch.setattr(launch, "_cluster_session", started)


@pytest.fixture(scope="session")
def render_into():
    """`render_template(output_dir, **answers)`, for fixtures of any scope that need a project of their own."""
    from support.rendering import render_template

    return render_template


@pytest.fixture(autouse=True)
def mlflow_uris_restored():
    """MLflow's set_tracking_uri and set_registry_uri also export MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI, which
    every later test in this process would take for a user's choice: a test that sets them leaves them as it found
    them."""
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    before = {name: os.environ.get(name) for name in names}
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or all(os.environ.get(name) == before[name] for name in names):
        return
    mlflow.set_tracking_uri(before["MLFLOW_TRACKING_URI"])
    mlflow.set_registry_uri(before["MLFLOW_REGISTRY_URI"])
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
