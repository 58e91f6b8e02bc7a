"""procs.exit.exit_without_teardown: a process ends with its code, after what the interpreter's exit
must do (threads, atexit handlers, buffered output), without tearing down its modules."""

from __future__ import annotations

import os
import subprocess
import sys

PRELUDE = ("import atexit, sys, threading, time\n"
           "from geotrain.procs.exit import exit_without_teardown\n")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, timeout=60)


def test_the_code_comes_after_the_threads_the_atexit_handlers_and_a_flush(tmp_path):
    marker = tmp_path / "atexit.txt"
    done = _run(f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
                "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()\n"
                "sys.stdout.write('buffered')\n"
                "exit_without_teardown(3)\n")
    assert done.returncode == 3, done.stderr
    assert "thread done" in done.stdout and "buffered" in done.stdout
    assert marker.read_text() == "ran"


def test_without_joining_threads_a_thread_that_never_ends_does_not_hold_the_exit():
    done = _run("threading.Thread(target=lambda: time.sleep(600)).start()\n"
                "print('main done')\n"
                "exit_without_teardown(0, join_threads=False)\n")
    assert done.returncode == 0 and done.stdout == "main done\n"


def test_a_flush_that_fails_turns_success_into_the_interpreters_code():
    buffered = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-c", PRELUDE + "sys.stdout.write('x')\nexit_without_teardown(0)\n"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, env=buffered)
    assert done.returncode == 120
