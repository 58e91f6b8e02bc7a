"""Failure detection: heartbeats in the rendezvous store, a watchdog thread, and a shared abort notice.

Every worker runs one daemon thread that, every `interval_s`:
  1. bumps its heartbeat `hb/<rank>` = "<counter> <last completed step>";
  2. reads the abort notice `abort`: if some worker posted one, this worker exits with it;
  3. reads every other live rank's heartbeat: a counter that has not changed for `timeout_s` (on this
     worker's own monotonic clock, so clocks of different machines never matter) means that rank died
     or hangs; this worker posts the abort notice naming it and its last completed step, and exits.
The main thread publishes `step/<rank>` = completed steps as soon as a step ends (through its own
store connection), for failure messages and the launcher's progress. A rank that finished posts
`done/<rank>` and is no longer watched. Losing the store itself (its host,
the launcher or torchrun's agent, is gone) for `timeout_s` is also fatal. Exits use os._exit, which
works even while the main thread is blocked inside a gloo call.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from geotrain.procs import EXIT_PEER_LOST


class Watchdog:
    """Heartbeat + failure watch of one rank over a torch.distributed Store."""

    def __init__(self, store: Any, step_store: Any, rank: int, world_size: int, describe: Callable[[int], str],
                 interval_s: float = 0.5, timeout_s: float = 10.0,
                 exit_fn: Callable[[int], None] = os._exit) -> None:
        """`store` is used by the watchdog thread only, `step_store` (another client of the same
        store) by the main thread only."""
        self.store = store
        self.step_store = step_store
        self.rank = rank
        self.world_size = world_size
        self.describe = describe
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.exit_fn = exit_fn
        self.completed_steps = 0  # steps this rank has finished (its optimizer step done)
        self.failure: str | None = None
        self._counter = 0
        self._seen: dict[int, tuple[str, float]] = {}
        self._store_ok_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"geotrain-watchdog-{rank}", daemon=True)

    def start(self) -> None:
        self.publish_step(self.completed_steps)
        self._beat()
        started = time.monotonic()
        self._seen = {rank: ("", started) for rank in range(self.world_size) if rank != self.rank}
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (after this rank finished); marks it done so peers stop watching it."""
        self._stop.set()
        self._thread.join(timeout=5 * self.interval_s)
        try:
            self.store.set(f"done/{self.rank}", "1")
        except Exception:  # noqa: BLE001 - the run is over; a missing store changes nothing
            pass

    def post_abort(self, message: str) -> None:
        """Tell every worker to stop, with `message` (first notice wins in practice: all read it)."""
        try:
            if not self.store.check(["abort"]):
                self.store.set("abort", message)
        except Exception:  # noqa: BLE001 - the store may be the thing that failed
            pass

    def publish_step(self, completed_steps: int) -> None:
        """Main thread: this rank has finished `completed_steps` steps."""
        self.completed_steps = completed_steps
        self.step_store.set(f"step/{self.rank}", str(completed_steps))

    def _beat(self) -> None:
        self._counter += 1
        self.store.set(f"hb/{self.rank}", str(self._counter))

    def _fail(self, message: str, post: bool) -> None:
        self.failure = message
        if post:
            self.post_abort(message)
        print(f"geotrain worker {self.describe(self.rank)}: {message}", file=sys.stderr, flush=True)
        self.exit_fn(EXIT_PEER_LOST)

    def check_once(self) -> str | None:
        """One round of heartbeat + checks; returns the failure message if one is found."""
        now = time.monotonic()
        try:
            self._beat()
            if self.store.check(["abort"]):
                return "abort: " + self.store.get("abort").decode()
            stale = []
            for rank in list(self._seen):
                if self.store.check([f"done/{rank}"]):
                    del self._seen[rank]
                    continue
                value = self.store.get(f"hb/{rank}").decode() if self.store.check([f"hb/{rank}"]) else ""
                last_value, last_change = self._seen[rank]
                if value != last_value:
                    self._seen[rank] = (value, now)
                elif now - last_change > self.timeout_s:
                    stale.append(rank)
            self._store_ok_at = now
        except Exception as exc:  # noqa: BLE001 - any store error means the store is unreachable
            if now - self._store_ok_at > self.timeout_s:
                return f"lost the rendezvous store for {now - self._store_ok_at:.1f} s ({exc}); its host is gone"
            return None
        if stale:
            rank = stale[0]
            try:
                steps = int(self.store.get(f"step/{rank}").decode())
            except Exception:  # noqa: BLE001 - a diagnostic only
                steps = 0
            return (f"lost {self.describe(rank)}: no heartbeat for {self.timeout_s:g} s; "
                    f"its last completed step: {steps if steps else 'none'} "
                    f"(this worker's: {self.completed_steps or 'none'})")
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            message = self.check_once()
            if message is not None and not self._stop.is_set():
                self._fail(message, post=not message.startswith("abort: "))
                return
