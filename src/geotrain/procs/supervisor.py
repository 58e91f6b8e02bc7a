"""The one supervisor: start N ranks, watch all of them, stop the rest after the first failure, and
say what happened in one `Verdict`.

    with Supervisor([Command(argv, env) for env in envs], grace_s=5, timeout_s=600) as ranks:
        verdict = ranks.wait()
    print(verdict.message)          # "rank 1 killed by SIGKILL; ranks [0] stopped after the 5 s grace period"

A rank is a program (`Command`, a subprocess) or a function in a multiprocessing context (`Target`,
e.g. the fork server of geotrain.procs.lifeline.forkserver_context). Guarantees:
  - Every tick polls every rank, so a dead rank's exit is read even while others run.
  - After the first failure (a non-zero exit or a signal) the others get `grace_s` to notice and end
    on their own (`signal_grace_s` when that rank was killed by a signal: it wrote nothing, and its
    peers can only say they lost it), then their process groups get SIGTERM, `term_s` later SIGKILL;
    the same at `timeout_s` (the verdict says timed out).
  - Each rank leads its own session, so its whole tree (whatever the rank starts) is stopped with it;
    each rank dies with the launcher (PR_SET_PDEATHSIG and the lifeline thread), and a guardian
    process (geotrain.procs.guardian) SIGKILLs every rank's group and removes the registered folders
    when the launcher is SIGKILLed.
  - `restart(ranks)` stops some ranks (their trees) and starts them again from the same spec.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing import resource_tracker
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from geotrain.procs.guardian import Guardian
from geotrain.procs.lifeline import die_with_parent, describe_exit, set_parent_death_signal
from geotrain.procs.rundir import current_run_dir, run_paths


EXIT_PEER_LOST = 75
"""Exit status of a rank that stopped because another rank (or the store) was lost: a victim, never
the culprit while a rank that failed on its own is in sight (`Supervisor.wait`). 75 (sysexits'
EX_TEMPFAIL), not a small number a user's script would pick for its own failures."""


@dataclass(frozen=True)
class Command:
    """A rank as a program: `argv` with environment `env` (None: inherited); stdout and stderr to
    `log` (None: inherited); `preexec` runs in the child between fork and exec (e.g. entering a
    network namespace), after the parent-death signal is armed."""

    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None
    log: Path | None = None
    preexec: Callable[[], None] | None = None


@dataclass(frozen=True)
class Target:
    """A rank as a function: `target(*args)` in a process of multiprocessing `context`, named `name`
    (`daemon`: multiprocessing's flag; a daemon cannot start processes of its own)."""

    context: Any
    target: Callable[..., Any]
    args: tuple[Any, ...]
    name: str
    daemon: bool = False


@dataclass(frozen=True)
class Verdict:
    """How a supervised run ended. `returncodes`: per rank, as Popen's (negative: killed by that
    signal); `first_failed`: the first rank seen failing (None: none failed); `stopped`: ranks the
    supervisor stopped (after a failure or the timeout); `message`: one line."""

    returncodes: tuple[int, ...]
    first_failed: int | None
    stopped: frozenset[int]
    timed_out: bool
    pids: tuple[int, ...]
    wall_s: float
    message: str

    @property
    def ok(self) -> bool:
        return self.first_failed is None and not self.timed_out

    @property
    def rank_codes(self) -> tuple[int, ...]:
        """Per rank, as a shell shows it (128 + N for signal N)."""
        return tuple(exit_code_of(code) for code in self.returncodes)

    def culprit(self) -> tuple[int, str] | None:
        """(rank, how it ended) to name for a failed run, in order of evidence: the first rank seen
        failing on its own (a signal, its own error); else a rank still running after the grace period
        (hung: the supervisor stopped it); else the first that only lost a peer. None: none failed."""
        if self.first_failed is None:
            return None
        first = self.first_failed
        if self.returncodes[first] == EXIT_PEER_LOST and self.stopped:
            return min(self.stopped), "stopped responding (hung; killed by the launcher)"
        return first, describe_exit(self.returncodes[first])

    @property
    def exit_code(self) -> int:
        """124 on a timeout, else the worst code among the ranks that ended on their own (ranks
        stopped after a failure, and ranks that only lost a peer, do not mask its code)."""
        if self.timed_out:
            return 124
        own = [c for rank, c in enumerate(self.rank_codes) if rank not in self.stopped and c != EXIT_PEER_LOST]
        return max(own, default=EXIT_PEER_LOST if EXIT_PEER_LOST in self.rank_codes else 0)


@dataclass(frozen=True)
class LaunchResult:
    """A finished launch: the supervisor's verdict, what the launcher made of the run (a report, None
    where there is none) and the launcher's wall seconds (preparation included)."""

    verdict: Verdict
    report: Any
    wall_s: float

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def rank_codes(self) -> tuple[int, ...]:
        return self.verdict.rank_codes

    @property
    def timed_out(self) -> bool:
        return self.verdict.timed_out

    @property
    def pids(self) -> tuple[int, ...]:
        return self.verdict.pids


def exit_code_of(returncode: int) -> int:
    """A process's exit status as a shell shows it: 128 + N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _preexec(launcher_pid: int, extra: Callable[[], None] | None) -> None:
    """In the child before exec: a session of its own (in Popen), the parent-death signal, and
    no life after a launcher that died before the signal was armed."""
    set_parent_death_signal()
    if os.getppid() != launcher_pid:
        os._exit(1)
    if extra is not None:
        extra()


EXIT_INTERRUPTED = 130


def _run_target(launcher_pid: int, name: str, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """The entry of a `Target` rank: its own session, dying with the launcher, then the target; a
    SIGINT sent to the rank alone ends it with one line and status 130 (not a traceback)."""
    os.setsid()
    _drop_held_interrupt()
    die_with_parent(launcher_pid)  # the parent may be a fork server: watch the launcher too
    try:
        target(*args)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)


def _drop_held_interrupt() -> None:
    """In a `Target` rank, once it has its own session: discard a SIGINT held since its start (see
    `_Rank.start`; it was a Ctrl-C meant for the launcher, which stops the ranks itself) and take
    SIGINT again, with the handler Python installed."""
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a pending ignored signal is discarded
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, handler)


def spawn(command: Command, launcher_pid: int | None = None, **popen_kwargs: Any) -> subprocess.Popen:
    """Start `command` as a supervised rank is started (own session, dies with this process); also
    for the few helper programs a launcher runs outside a supervisor (e.g. a lab's link probe, with
    `popen_kwargs` such as stdout=PIPE). Stop it with `stop_tree`."""
    launcher_pid = os.getpid() if launcher_pid is None else launcher_pid
    log = None if command.log is None else open(command.log, "wb")  # noqa: SIM115 - closed below
    streams = {"stdout": log, "stderr": None if log is None else subprocess.STDOUT}
    try:
        return subprocess.Popen(list(command.argv), env=None if command.env is None else dict(command.env),
                                start_new_session=True, preexec_fn=lambda: _preexec(launcher_pid, command.preexec),
                                **{**streams, **popen_kwargs})
    finally:
        if log is not None:
            log.close()


def stop_tree(process: subprocess.Popen, term_s: float = 2.0) -> int:
    """SIGTERM the process group of a `spawn`ed process, SIGKILL it `term_s` later, reap the
    process; returns its return code."""
    rank = _Rank.of(process)
    rank.stop(term_s)
    return process.wait()


class _Rank:
    """One started rank: a Popen or a multiprocessing Process behind one small interface."""

    def __init__(self, process: Any, is_popen: bool) -> None:
        self.process = process
        self.is_popen = is_popen
        self.pid: int = process.pid

    @classmethod
    def start(cls, spec: Command | Target, launcher_pid: int) -> _Rank:
        if isinstance(spec, Command):
            return cls(spawn(spec, launcher_pid), True)
        process = spec.context.Process(target=_run_target, args=(launcher_pid, spec.name, spec.target, spec.args),
                                       name=spec.name, daemon=spec.daemon)
        # Until the rank calls setsid it shares the launcher's process group, so a Ctrl-C in the
        # terminal reaches it too: a "spawn" child still importing (seconds) would print a
        # traceback. SIGINT stays blocked in the child (fork and exec keep the mask) until it has
        # its own session; this thread gets a Ctrl-C held meanwhile when the mask is restored.
        # multiprocessing starts its resource tracker on a first start and unblocks SIGINT after
        # it: start the tracker first.
        if spec.context.get_start_method() != "fork":
            resource_tracker.ensure_running()
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return cls(process, False)

    @classmethod
    def of(cls, process: subprocess.Popen) -> _Rank:
        return cls(process, True)

    def poll(self) -> int | None:
        return self.process.poll() if self.is_popen else self.process.exitcode

    def wait(self, timeout_s: float) -> None:
        if self.is_popen:
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        else:
            self.process.join(timeout=timeout_s)

    def signal_tree(self, sig: int) -> None:
        """Signal the rank's process group (its tree), or the rank alone before it has one."""
        try:
            os.killpg(self.pid, sig)
            return
        except (ProcessLookupError, PermissionError):
            pass
        if self.poll() is None:  # not yet a group leader (a Target between fork and setsid)
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, term_s: float) -> None:
        """SIGTERM the tree, SIGKILL it `term_s` later (0: at once), and reap the rank."""
        _stop_all([self], term_s)


def _stop_all(ranks: Sequence[_Rank], term_s: float) -> None:
    """SIGTERM the trees of `ranks` that run, SIGKILL every tree `term_s` later (also of ranks that
    ended: their children may live on), and reap the ranks."""
    if term_s > 0:
        live = [rank for rank in ranks if rank.poll() is None]
        for rank in live:
            rank.signal_tree(signal.SIGTERM)
        deadline = time.monotonic() + term_s
        for rank in live:
            rank.wait(max(0.0, deadline - time.monotonic()))
    for rank in ranks:
        rank.signal_tree(signal.SIGKILL)
    for rank in ranks:
        rank.wait(10.0)


class Supervisor:
    """Start and watch `specs` (rank i = specs[i]); see the module docstring. Use as a context
    manager (or call `start` and `close`): leaving it stops every rank's tree."""

    def __init__(self, specs: Sequence[Command | Target], *, grace_s: float = 5.0, term_s: float = 2.0,
                 timeout_s: float | None = None, poll_s: float = 0.05, cleanup_paths: Sequence[Path] = (),
                 signal_grace_s: float | None = None) -> None:
        """grace_s: seconds the others get after the first failure (signal_grace_s, None: grace_s, when
        that rank was killed by a signal); term_s: seconds between SIGTERM and SIGKILL (0: SIGKILL at
        once); timeout_s: wall limit of `wait` (None: none); cleanup_paths: folders the guardian
        removes should this launcher be SIGKILLed."""
        self._specs = list(specs)
        self.grace_s, self.term_s, self.timeout_s, self.poll_s = grace_s, term_s, timeout_s, poll_s
        self.signal_grace_s = grace_s if signal_grace_s is None else signal_grace_s
        self._cleanup_paths = [Path(p) for p in cleanup_paths]
        self._ranks: list[_Rank] = []
        self._guardian: Guardian | None = None
        self._launcher_pid = os.getpid()
        self._started = 0.0

    @property
    def world_size(self) -> int:
        return len(self._specs)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(rank.pid for rank in self._ranks)

    def start(self) -> Supervisor:
        """Start every rank; if one cannot start, stop those started and re-raise."""
        self._started = time.monotonic()
        self._guardian = Guardian()
        run_dir = current_run_dir()  # the whole run directory, should this launcher be SIGKILLed
        for path in [*self._cleanup_paths, *(run_paths(run_dir) if run_dir is not None else [])]:
            self._guardian.tell("path", str(path))
        try:
            for spec in self._specs:
                self._ranks.append(self._start_one(spec))
        except BaseException:
            self.close()
            raise
        return self

    def _start_one(self, spec: Command | Target) -> _Rank:
        rank = _Rank.start(spec, self._launcher_pid)
        if self._guardian is not None:
            self._guardian.tell("group", str(rank.pid))
        return rank

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def poll(self) -> tuple[int | None, ...]:
        """Every rank's return code (None: running), reading each rank's exit."""
        return tuple(rank.poll() for rank in self._ranks)

    def wait(self, on_tick: Callable[[], None] | None = None) -> Verdict:
        """Wait until every rank has exited, or the first failure's grace period or the timeout has
        passed (the rest are then stopped); `on_tick` runs once per poll while all is well."""
        deadline = None if self.timeout_s is None else self._started + self.timeout_s
        first, failed_at, timed_out = None, 0.0, False
        stopped: frozenset[int] = frozenset()
        while True:
            codes = self.poll()
            now = time.monotonic()
            failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
            if first is None and failed:
                failed_at = now
            if failed and (first is None or codes[first] == EXIT_PEER_LOST):
                # a rank that only lost its peer is a victim: name one that failed on its own when seen
                own = [rank for rank in failed if codes[rank] != EXIT_PEER_LOST]
                first = own[0] if own else (failed[0] if first is None else first)
            running = frozenset(rank for rank, code in enumerate(codes) if code is None)
            if not running:
                break
            timed_out = deadline is not None and now >= deadline
            if timed_out or (first is not None and now - failed_at >= self._grace_after(codes[first])):
                stopped = running
                self.stop(sorted(running))
                break
            if on_tick is not None and first is None:
                on_tick()
            time.sleep(self.poll_s)
        returncodes = tuple(int(code) for code in self.poll())
        return Verdict(returncodes, first, stopped, timed_out, self.pids, time.monotonic() - self._started,
                       self._message(returncodes, first, stopped, timed_out))

    def _grace_after(self, code: int | None) -> float:
        """Seconds the others get after a rank's failure with return code `code` (negative: a signal)."""
        return self.signal_grace_s if code is not None and code < 0 else self.grace_s

    def _message(self, codes: tuple[int, ...], first: int | None, stopped: frozenset[int], timed_out: bool) -> str:
        if timed_out:
            return f"timed out after {self.timeout_s:g} s; ranks {sorted(stopped)} of {len(codes)} stopped"
        if first is None:
            return f"all {len(codes)} ranks exited with status 0"
        message = f"rank {first} {describe_exit(codes[first])}"
        if stopped:
            message += f"; ranks {sorted(stopped)} stopped after the {self._grace_after(codes[first]):g} s grace period"
        return message

    def stop(self, ranks: Sequence[int] | None = None, term_s: float | None = None) -> None:
        """SIGTERM the trees of `ranks` (default: all), SIGKILL them `term_s` later (default: the
        supervisor's), and reap the ranks."""
        chosen = [self._ranks[r] for r in (range(len(self._ranks)) if ranks is None else ranks)]
        _stop_all(chosen, self.term_s if term_s is None else term_s)

    def restart(self, ranks: Sequence[int], spec: Command | Target | None = None) -> None:
        """Stop the trees of `ranks` (a rank or a group of ranks) and start them again from their specs (from
        `spec`, which becomes theirs, if given)."""
        self.stop(ranks)
        for r in ranks:
            if spec is not None:
                self._specs[r] = spec
            self._ranks[r] = self._start_one(self._specs[r])

    def close(self) -> None:
        """Stop every rank's tree and release the guardian (nothing left to do for it)."""
        try:
            if self._ranks:
                self.stop()
        finally:
            if self._guardian is not None:
                self._guardian.close(release=True)
                self._guardian = None
