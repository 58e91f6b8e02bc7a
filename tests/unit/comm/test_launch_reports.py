"""The launcher still reads a worker's report that reaches the queue after the worker was seen to exit."""

import multiprocessing
import threading
import time

from geotrain.comm.launch import _await_reports


def test_a_report_that_arrives_after_the_exit_was_seen_is_read_and_the_wait_ends_with_it():
    queue = multiprocessing.get_context("spawn").Queue()
    threading.Timer(0.3, lambda: queue.put((1, "ok", b"late"))).start()
    started = time.monotonic()
    messages = _await_reports(queue, {1}, grace_s=10.0)
    assert messages == [(1, "ok", b"late")]
    assert time.monotonic() - started < 10.0  # it stops when rank 1 has reported, not at the grace's end
    assert _await_reports(queue, set(), grace_s=10.0) == []  # nothing awaited: no wait
