"""Every wait of a local run has a bound, and past it an error that says what it waited for and what to do.

DeepSpeed builds its CPU communication op on first use under a lock file in torch's extension folder; a build killed
midway leaves the lock and every later DeepSpeed run would wait on it forever (torch/utils/file_baton.py): one that no
live build holds is taken over at once, a live one waited for within a bound (engines/test_deepspeed.py kills one).
A peer that never joins a collective ends the run after --collective-timeout seconds.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time

import pytest

from distributed_training.engines import LaunchError
from distributed_training.engines.deepspeed import HOLDER_FILE, build_cpu_communication_op, _extension_folder

pytestmark = pytest.mark.engine


# What a call does once the op is built: remove a dead build's lock, start Python, import DeepSpeed, find the build
# up to date, load it. Seconds on 2 quiet cores; the bound is for 2 busy ones. A lock left in place would make the
# call wait forever, so any finite bound catches that.
LOAD_BOUND_S = 300


@pytest.fixture
def extensions(deepspeed_op_built, tmp_path, monkeypatch):
    """A private extension folder holding the op as built already: a copy of the session's build (conftest.py),
    so the build from scratch (a minute, or five on a busy machine) is paid once per session, outside these bounds."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    built = deepspeed_op_built
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    mine = _extension_folder()
    shutil.rmtree(mine)
    shutil.copytree(built, mine, ignore=shutil.ignore_patterns("lock"))
    return mine


def test_a_lock_left_by_a_killed_build_is_removed_and_the_run_goes_on(extensions, capsys):
    lock = os.path.join(extensions, "lock")
    open(lock, "w").close()  # fresh, and no build holds it
    started = time.monotonic()
    build_cpu_communication_op(timeout=LOAD_BOUND_S)
    assert not os.path.exists(lock) and time.monotonic() - started < LOAD_BOUND_S
    assert f"removed {lock}, left by a DeepSpeed op build that was killed" in capsys.readouterr().out


def test_a_build_that_waits_past_its_bound_on_a_live_build_is_an_error_naming_it(extensions):
    lock, holder = os.path.join(extensions, "lock"), os.path.join(extensions, HOLDER_FILE)
    open(lock, "w").close()
    with open(holder, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a build in progress: this process, alive
        started = time.monotonic()
        with pytest.raises(LaunchError, match=f"did not build within 3 s: another run's build holds {holder}"):
            build_cpu_communication_op(timeout=3)
    assert time.monotonic() - started < 30 and os.path.exists(lock)
