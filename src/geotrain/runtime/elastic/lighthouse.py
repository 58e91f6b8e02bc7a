"""The torchft Lighthouse of an elastic run, as one supervised process of the launcher (it ends with
the launcher, SIGKILL included: geotrain.procs). It forms each quorum from the replica groups that ask
and heartbeat: as soon as every healthy group has asked, or `join_timeout_s` after the first asked
with at least `min_replicas` of them; a group silent for `heartbeat_timeout_s` is left out.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from geotrain.procs import set_process_name


@dataclass(frozen=True)
class LighthouseSettings:
    """Where the lighthouse listens (`bind`, e.g. 127.0.0.1:0 or [::]:29510), its quorum rule and
    timings (seconds)."""

    bind: str
    min_replicas: int
    join_timeout_s: float
    heartbeat_timeout_s: float
    quorum_tick_s: float = 0.05


def join_timeout_s(comm_timeout_s: float) -> float:
    """How long the lighthouse waits for a healthy group that has not asked for this quorum (seconds): half the
    groups' quorum timeout (`--comm-timeout`), so a late group (a restarted one still loading, one held by a
    slow step) is left for the next quorum before the groups that asked give up waiting (with the two equal, a
    loaded machine once saw the groups that asked time out)."""
    return comm_timeout_s / 2


def local_address(address: str, host: str) -> str:
    """torchft's advertised 'http://<hostname>:<port>' with `host` instead of the hostname."""
    return f"http://{host}:{urlparse(address).port}"


def quiet_torchft(log: Path) -> None:
    """torchft logs every quorum and commit (Rust and Python) and its checkpoint server every request on
    stderr: this process's stdout and stderr go to `log` instead (its own error line reaches the launcher
    by file), its stdin comes from /dev/null. Nothing it does to its standard streams (a write, O_NONBLOCK
    on the open file description) then reaches the launcher's stdout, where the run's JSON goes."""
    os.environ.setdefault("RUST_LOG", "warn")
    sys.stdout.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (fd, 1), (fd, 2)):
        os.dup2(source, target)
    os.close(fd)
    os.close(null)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's stdout
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's stderr


def lighthouse_main(settings: LighthouseSettings, address_file: str, host: str) -> None:
    """Run a LighthouseServer until killed; its address (with `host`) goes to `address_file`."""
    set_process_name("geotrain-lighthouse")
    quiet_torchft(Path(address_file).with_name("lighthouse.log"))
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind=settings.bind, min_replicas=settings.min_replicas,
                              join_timeout_ms=int(settings.join_timeout_s * 1000),
                              quorum_tick_ms=max(1, int(settings.quorum_tick_s * 1000)),
                              heartbeat_timeout_ms=int(settings.heartbeat_timeout_s * 1000))
    path = Path(address_file)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(local_address(server.address(), host))
    os.replace(tmp, path)
    while True:  # the supervisor stops this process; the server runs in torchft's threads
        time.sleep(3600)
