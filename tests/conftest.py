"""Shared fixtures."""

import os
import threading
import time

import pytest
import torch

_RUNS_BEFORE = pytest.StashKey[bool]()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's training tests on one torch thread (as the demo does), restoring the count after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SLEEPING_LIBRARY_THREADS = frozenset({"tqdm_monitor"})  # a library's own thread, asleep between checks


@pytest.fixture(autouse=True)
def no_thread_outlives_its_test():
    """A thread a test leaves running stays in pytest's process for the rest of the suite (one spinning
    in Python holds the GIL and slowed every later test several times over): fail the test that left it."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 2.0
    while True:
        left = [t for t in threading.enumerate()
                if t not in before and t.is_alive() and t.name not in SLEEPING_LIBRARY_THREADS]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if left:
        pytest.fail(f"the test left {len(left)} thread(s) running: {sorted(t.name for t in left)}")


@pytest.fixture(autouse=True)
def no_default_run_dir_in_the_repository():
    """`geotrain train` without --run-dir writes geotrain-runs/ under its working directory: a test that runs it
    from the repository root must pass `--run-dir none` (or a run directory, or run in tmp_path). Fail the test
    that made one there (and remove it, so later tests are judged on their own). With several pytest-xdist
    workers a folder made by a test on another worker would be blamed here: the session's end checks instead
    (pytest_sessionfinish)."""
    import shutil
    from pathlib import Path

    from paths import ROOT

    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        yield
        return

    watched = [runs for runs in {ROOT / "geotrain-runs", Path.cwd() / "geotrain-runs"} if not runs.exists()]
    yield
    left = [runs for runs in watched if runs.exists()]
    for runs in left:
        shutil.rmtree(runs, ignore_errors=True)
    if left:
        pytest.fail(f"the test left {left[0]} (run `geotrain train` with --run-dir none, or in tmp_path)")


def pytest_sessionstart(session):
    from paths import ROOT

    session.config.stash[_RUNS_BEFORE] = (ROOT / "geotrain-runs").exists()


def pytest_sessionfinish(session, exitstatus):
    """The whole session (the xdist controller, or a plain run) fails if it left geotrain-runs/ in the repository
    root (no_default_run_dir_in_the_repository names the test in a plain run)."""
    import shutil

    from paths import ROOT

    if hasattr(session.config, "workerinput") or session.config.stash.get(_RUNS_BEFORE, True):
        return
    runs = ROOT / "geotrain-runs"
    if runs.exists():
        names = sorted(p.name for p in runs.iterdir())[:5]
        shutil.rmtree(runs, ignore_errors=True)
        session.config.get_terminal_writer().line(
            f"the session left {runs} ({', '.join(names)}): a test ran `geotrain train` without --run-dir none",
            red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

