"""The one supervisor (geotrain.procs) with real processes: every rank polled, first failure ->
grace -> SIGTERM -> SIGKILL, a verdict naming the rank, whole trees stopped, restart, and a
SIGKILLed launcher leaving nothing (the guardian)."""

from __future__ import annotations

from paths import ROOT
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from geotrain.procs import EXIT_PEER_LOST, Command, Supervisor, Target, torchrun_env
from proctree import alive, default_signals

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]
SRC = str(ROOT / "src")


def py(code: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-c", textwrap.dedent(code), *args)


SLEEP_WITH_CHILD = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(300)
"""


def _pids(path: Path, limit_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + limit_s
    while not (path.exists() and path.read_text().count(" ") == 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def _gone(pids: list[int], limit_s: float = 10.0) -> bool:
    deadline = time.monotonic() + limit_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def test_a_killed_rank_is_seen_while_rank_0_runs_and_rank_0_is_termed_after_the_grace(tmp_path):
    """The rank polled first is alive: the dead one must still be read (emulate's old loop stopped
    at the first live rank and let rank 0 run on)."""
    specs = [Command(py("import time; time.sleep(60)")),
             Command(py("import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)"))]
    started = time.monotonic()
    with Supervisor(specs, grace_s=1.0, term_s=2.0) as supervisor:
        verdict = supervisor.wait()
    elapsed = time.monotonic() - started
    assert verdict.first_failed == 1
    assert verdict.returncodes == (-signal.SIGTERM, -signal.SIGKILL)
    assert verdict.rank_codes == (143, 137) and verdict.exit_code == 137  # the stopped rank does not mask it
    assert verdict.stopped == frozenset({0}) and not verdict.timed_out
    assert verdict.message == "rank 1 killed by SIGKILL; ranks [0] stopped after the 1 s grace period"
    assert 1.5 <= elapsed < 10.0


def test_after_a_rank_killed_by_a_signal_the_others_get_the_signal_grace_and_after_its_own_error_the_grace():
    """signal_grace_s 0 (the training launcher's): a SIGKILLed rank is the culprit already, its peers are stopped at
    once instead of after the 60 s grace; a rank that exits with its own error still leaves the others the grace."""
    killed = Command(py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    with Supervisor([Command(py("import time; time.sleep(60)")), killed], grace_s=60.0, signal_grace_s=0.0,
                    term_s=0.0) as supervisor:
        verdict = supervisor.wait()
    assert verdict.first_failed == 1 and verdict.stopped == frozenset({0})
    assert verdict.returncodes == (-signal.SIGKILL, -signal.SIGKILL)
    assert verdict.message == "rank 1 killed by SIGKILL; ranks [0] stopped after the 0 s grace period"
    ends = Command(py("import sys, time; time.sleep(0.5); sys.exit(0)"))
    with Supervisor([ends, Command(py("import sys; sys.exit(3)"))], grace_s=60.0, signal_grace_s=0.0) as supervisor:
        verdict = supervisor.wait()
    assert verdict.returncodes == (0, 3) and not verdict.stopped  # rank 0 ended on its own within the grace


def test_a_rank_that_ignores_sigterm_is_killed_term_s_later(tmp_path):
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    specs = [Command(py(ignore)), Command(py("import sys, time; time.sleep(0.3); sys.exit(3)"))]
    started = time.monotonic()
    with Supervisor(specs, grace_s=0.5, term_s=1.0) as supervisor:
        verdict = supervisor.wait()
    assert verdict.returncodes == (-signal.SIGKILL, 3) and verdict.exit_code == 3
    assert verdict.message.startswith("rank 1 exited with status 3")
    assert time.monotonic() - started < 10.0


def test_a_rank_that_only_lost_its_peer_is_never_named_while_the_culprit_is_seen():
    # both exit within one poll (1 s): rank 0 with the victim's status, rank 1 with its own error
    victim = f"import sys, time; time.sleep(0.3); sys.exit({EXIT_PEER_LOST})"
    culprit = "import sys, time; time.sleep(0.2); sys.exit(3)"
    with Supervisor([Command(py(victim)), Command(py(culprit))], grace_s=0.5, poll_s=1.0) as supervisor:
        verdict = supervisor.wait()
    assert verdict.returncodes == (EXIT_PEER_LOST, 3)
    assert verdict.first_failed == 1 and verdict.exit_code == 3
    assert verdict.message == "rank 1 exited with status 3"


def test_timeout_stops_every_rank_and_says_so():
    specs = [Command(py("import time; time.sleep(60)")) for _ in range(2)]
    with Supervisor(specs, timeout_s=1.0, term_s=1.0) as supervisor:
        verdict = supervisor.wait()
    assert verdict.timed_out and verdict.exit_code == 124 and verdict.first_failed is None
    assert verdict.stopped == frozenset({0, 1}) and verdict.returncodes == (-signal.SIGTERM,) * 2
    assert verdict.message == "timed out after 1 s; ranks [0, 1] of 2 stopped"


def test_success_and_on_tick_and_torchrun_env(tmp_path):
    env = torchrun_env(1, 2, "127.0.0.1", 29511, base={"PATH": os.environ["PATH"]}, EXTRA="x")
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "OMP_NUM_THREADS", "EXTRA")} == \
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_PORT": "29511", "OMP_NUM_THREADS": "1",
         "EXTRA": "x"}
    # the ranks outlive a few polls (0.05 s each): ranks that end before the first poll see no tick
    code = ("import os, sys, time; open(sys.argv[1], 'w').write(os.environ['RANK'] + os.environ['MASTER_ADDR']); "
            "time.sleep(0.5)")
    ticks = []
    specs = [Command(py(code, str(tmp_path / f"r{r}")), torchrun_env(r, 2, "10.0.0.1", 1)) for r in range(2)]
    with Supervisor(specs) as supervisor:
        verdict = supervisor.wait(on_tick=lambda: ticks.append(1))
    assert verdict.ok and verdict.returncodes == (0, 0) and verdict.exit_code == 0 and ticks
    assert [(tmp_path / f"r{r}").read_text() for r in range(2)] == ["010.0.0.1", "110.0.0.1"]


def test_stopping_a_rank_stops_the_children_it_started(tmp_path):
    specs = [Command(py(SLEEP_WITH_CHILD, str(tmp_path / "pids")))]
    with Supervisor(specs, term_s=1.0) as supervisor:
        pids = _pids(tmp_path / "pids")
    assert _gone(pids), "the rank's child outlived the supervisor"


def test_restart_starts_a_fresh_process_for_the_rank_and_kills_the_old_tree(tmp_path):
    specs = [Command(py("import time; time.sleep(60)")), Command(py(SLEEP_WITH_CHILD, str(tmp_path / "pids")))]
    with Supervisor(specs, term_s=1.0) as supervisor:
        old = _pids(tmp_path / "pids")
        (tmp_path / "pids").unlink()
        rank0 = supervisor.pids[0]
        supervisor.restart([1])
        new = _pids(tmp_path / "pids")
        assert _gone(old) and new[0] != old[0] and all(alive(p) for p in new)
        assert supervisor.pids == (rank0, new[0]) and supervisor.poll() == (None, None)
    assert _gone(new)


def _write_rank(path: str) -> None:
    Path(path).write_text(str(os.getpid()))


def test_a_target_rank_leads_its_own_group_and_is_watched(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with Supervisor([Target(context, _write_rank, (str(tmp_path / "t"),), "geotrain-test")]) as supervisor:
        verdict = supervisor.wait()
    assert verdict.ok and int((tmp_path / "t").read_text()) == verdict.pids[0]


LAUNCHER = """
import sys, time
from pathlib import Path
from geotrain.procs import Command, Supervisor
child = '''
import os, subprocess, sys, time
c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {c.pid}")
time.sleep(300)
'''
keep = Path(sys.argv[2])
keep.mkdir()
with Supervisor([Command((sys.executable, "-c", child, sys.argv[1]))], cleanup_paths=[keep]) as s:
    s.wait()
"""


def test_a_sigkilled_launcher_leaves_no_rank_no_grandchild_and_no_folder(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path / "pids"), str(tmp_path / "run")],
                                env={**os.environ, "PYTHONPATH": SRC}, start_new_session=True)
    try:
        pids = _pids(tmp_path / "pids")
        assert (tmp_path / "run").is_dir()
        launcher.kill()
        launcher.wait()
        assert _gone(pids), "a rank or its child outlived the SIGKILLed launcher"
        deadline = time.monotonic() + 10
        while (tmp_path / "run").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not (tmp_path / "run").exists()
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_descendant_named_finds_a_grandchild_by_its_process_name():
    from geotrain.procs.lifeline import descendant_named

    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "\"open('/proc/self/comm', 'w').write('gt-grandchild'); import time; time.sleep(60)\"]); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        found = None
        while found is None and time.monotonic() < deadline:
            found = descendant_named("gt-grandchild")
            time.sleep(0.05)
        assert found is not None and found != child.pid
        assert descendant_named("gt-grandchild", root=found) is None  # a process is not its own descendant
        assert descendant_named("no-such-process-name") is None
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


CTRL_C_WHILE_RANKS_START = """
import multiprocessing, os, signal, sys, time
from geotrain.procs import Supervisor, Target

if __name__ == "__mp_main__":
    time.sleep(2.0)  # a spawned rank's imports, before it has a session of its own


def nap():
    time.sleep(60)


if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    with Supervisor([Target(context, nap, (), f"nap-{i}") for i in range(2)], grace_s=0.0, term_s=1.0) as supervisor:
        time.sleep(0.5)
        try:
            os.killpg(os.getpgrp(), signal.SIGINT)  # Ctrl-C in the terminal: the whole foreground group
            time.sleep(1.0)
        except KeyboardInterrupt:
            print("launcher interrupted", flush=True)
        time.sleep(3.0)
        print("after ctrl-c", supervisor.poll(), flush=True)
        pid = supervisor.pids[0]
        os.kill(pid, signal.SIGINT)  # to the rank alone, once it runs: its own one line, status 130
        while supervisor.poll()[0] is None:
            time.sleep(0.05)
        print("after sigint to rank 0", supervisor.poll(), flush=True)
"""


def test_ctrl_c_while_spawned_ranks_import_reaches_only_the_launcher(tmp_path):
    """A Ctrl-C while "spawn" ranks still import (in the launcher's process group) is the launcher's:
    no rank prints a traceback or dies of it; once a rank runs, a SIGINT to it alone ends it with 130."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_WHILE_RANKS_START)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          start_new_session=True, preexec_fn=default_signals, env={**os.environ, "PYTHONPATH": SRC})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["launcher interrupted", "after ctrl-c (None, None)",
                                        "after sigint to rank 0 (130, None)"], done.stdout
    assert done.stderr.strip().splitlines() == ["nap-0: interrupted"]
