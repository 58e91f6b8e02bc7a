"""Shared fixtures."""

import threading
import time

import pytest
import torch


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
    that made one there (and remove it, so later tests are judged on their own)."""
    import shutil
    from pathlib import Path

    from paths import ROOT

    watched = [runs for runs in {ROOT / "geotrain-runs", Path.cwd() / "geotrain-runs"} if not runs.exists()]
    yield
    left = [runs for runs in watched if runs.exists()]
    for runs in left:
        shutil.rmtree(runs, ignore_errors=True)
    if left:
        pytest.fail(f"the test left {left[0]} (run `geotrain train` with --run-dir none, or in tmp_path)")
