"""Failure detection: heartbeats in the rendezvous store, a watchdog thread, and a shared abort notice.

Every worker runs one daemon thread that, every `interval_s`:
  1. bumps its heartbeat `hb/<rank>` = "<counter> <phase>" (phase: "waiting" while the main thread is blocked
     in a data-parallel collective, else "working", for the timeout message: `suspects`);
  2. reads the abort notice `abort`: if some worker posted one, this worker exits with it;
  3. reads every other live rank's heartbeat: a counter that has not changed for `timeout_s` (on this
     worker's own monotonic clock, so clocks of different machines never matter) means that rank died
     or hangs; this worker posts the abort notice naming it and its last completed step, and exits.
The main thread publishes `step/<rank>` = completed steps as soon as a step ends (through its own
store connection), for failure messages and the launcher's progress. A rank that finished posts
`done/<rank>` and is no longer watched. Losing the store itself (its host,
the launcher or torchrun's agent, is gone) for `timeout_s` is also fatal. Exits use os._exit, which
works even while the main thread is blocked inside a gloo call; before it, `last_words(why, step)` (the
run directory's observer: its buffered step lines and a "failure" event) runs on the watchdog thread.
`end_on_sigterm` does the same for the launcher's SIGTERM (a rank stopped after another one failed).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from geotrain.procs import EXIT_PEER_LOST


class Watchdog:
    """Heartbeat + failure watch of one rank over a torch.distributed Store."""

    def __init__(self, store: Any, step_store: Any, rank: int, world_size: int, describe: Callable[[int], str],
                 interval_s: float = 0.5, timeout_s: float = 10.0,
                 exit_fn: Callable[[int], None] = os._exit,
                 last_words: Callable[[str, int], None] | None = None,
                 waiting: Callable[[], bool] = lambda: False) -> None:
        """`store` is used by the watchdog thread only, `step_store` (another client of the same
        store) by the main thread only; `last_words(why, step)` runs before `exit_fn` (step: 0-based, the
        step this rank was in); `waiting()`: whether the main thread is blocked in a collective now."""
        self.store = store
        self.step_store = step_store
        self.rank = rank
        self.world_size = world_size
        self.describe = describe
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.exit_fn = exit_fn
        self.last_words = last_words
        self.waiting = waiting
        self.completed_steps = 0  # steps this rank has finished (its optimizer step done)
        self.failure: str | None = None
        self._posted: str | None = None  # the abort notice this rank posted (its main thread ends it itself)
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
        self._posted = message
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
        self.store.set(f"hb/{self.rank}", f"{self._counter} {'waiting' if self.waiting() else 'working'}")

    def _fail(self, message: str, post: bool) -> None:
        self.failure = message
        if post:
            self.post_abort(message)
        print(f"geotrain worker {self.describe(self.rank)}: {message}", file=sys.stderr, flush=True)
        self.say_last_words(f"ended by the watchdog: {message}")
        self.exit_fn(EXIT_PEER_LOST)

    def say_last_words(self, why: str) -> None:
        """`last_words(why, the step this rank is in)`, if any; an error in them never stops the exit."""
        if self.last_words is None:
            return
        try:
            self.last_words(why, self.completed_steps)
        except Exception:  # noqa: BLE001 - the rank ends all the same (a full disk, a closed file)
            pass

    def suspects(self, ranks: Iterable[int]) -> list[tuple[int, int]]:
        """Main thread, after a collective timed out: (rank, completed steps) of those of `ranks` that most
        likely held it up (alive: their heartbeat goes on): fewer completed steps than this rank, or as many and
        not waiting in a collective themselves; fewest steps first; [] if none or the store cannot tell."""
        found = []
        for rank in ranks:
            if rank == self.rank:
                continue
            try:
                done = int(self.step_store.get(f"step/{rank}").decode())
                phase = self.step_store.get(f"hb/{rank}").decode().partition(" ")[2]
            except Exception:  # noqa: BLE001 - a diagnostic only
                return []
            if done < self.completed_steps or (done == self.completed_steps and phase != "waiting"):
                found.append((done, rank))
        return [(rank, done) for done, rank in sorted(found)]

    def check_once(self) -> str | None:
        """One round of heartbeat + checks; returns the failure message if one is found."""
        now = time.monotonic()
        try:
            self._beat()
            if self.store.check(["abort"]):
                notice = self.store.get("abort").decode()
                if notice != self._posted:
                    return "abort: " + notice
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


def end_on_sigterm(watchdog: Watchdog) -> None:
    """Main thread: on SIGTERM (the launcher stopping this rank after another one failed), say the watchdog's
    last words, then die of SIGTERM as without the handler. The handler runs between Python bytecodes: a
    rank blocked inside a gloo call is SIGKILLed by the launcher first, with no last words."""
    def handler(signum: int, _frame: object) -> None:
        watchdog.say_last_words(f"stopped by the launcher (SIGTERM) after {watchdog.completed_steps} "
                                f"completed steps")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
