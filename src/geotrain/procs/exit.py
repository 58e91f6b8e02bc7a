"""Ending a process without the interpreter's module teardown.

Tearing down torch's modules at interpreter exit cost ~2 s of wall time and ~1.4 s of CPU at the end of
every `geotrain train` (a 3-step run: 9.3 -> 7.4 s), and it aborts a rank that succeeded, now and then
("terminate called without an active exception", exit 134; 1 run in 5 to 40 of a gloo script with
autograd on a loaded 2-core machine, torch 2.13, Python 3.11). The cause, from a core dump: gloo's worker
thread drops its last finished collective after the main thread's `wait()` returned; releasing the
tensors needs the GIL; once the interpreter is finalizing, taking the GIL ends the thread, which unwinds
through a noexcept destructor: std::terminate. `destroy_process_group()` does not stop gloo's threads.
`exit_without_teardown` does what the exit must do, then `os._exit`: geotrain's processes, the emulator's
bootstrap and the examples end with it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

FLUSH_FAILED_EXIT = 120
"""The interpreter's own exit code when flushing stdout or stderr at exit fails."""


def exit_without_teardown(code: int, join_threads: bool = True) -> NoReturn:
    """End the process with `code` as the interpreter's exit would, less its module teardown: with
    `join_threads`, wait for the non-daemon threads and run threading's exit hooks (thread pools);
    run the atexit handlers (multiprocessing's children, temporary directories, netlab labs, reports);
    flush stdout and stderr (a failed flush turns code 0 into FLUSH_FAILED_EXIT); then os._exit."""
    shutdown = getattr(threading, "_shutdown", None)  # what Py_FinalizeEx calls first
    if join_threads and shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a full or closed stream: the code already says what failed
            code = code or FLUSH_FAILED_EXIT
    os._exit(code)
