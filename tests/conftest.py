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
