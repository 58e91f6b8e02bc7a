"""Start one process per emulated device, as `torchrun --standalone` would, and wait for them.

Each child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR,
MASTER_PORT (and OMP_NUM_THREADS=1 unless set, as torchrun) and runs geotrain.emulate.bootstrap, which
installs the emulation and runs the script. If a child fails the others get `grace_s` to finish, then
SIGTERM, then SIGKILL; the same on timeout (exit 124) and Ctrl-C (exit 130). Children die with the
launcher. Exit code: the worst child's (a signal-killed child counts as 128 + signal), among the
children that ended on their own: ranks the launcher stopped after a failure do not mask its code.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geotrain.cluster import Cluster, cluster_to_dict
from geotrain.cluster.devices import check_device_list
from geotrain.emulate.bootstrap import CONFIG_ENV
from geotrain.emulate.network import EmulatedNetwork
from geotrain.emulate.report import merge_report
from geotrain.procs import set_parent_death_signal


@dataclass(frozen=True)
class LaunchConfig:
    """What to run and how: `target` is [SCRIPT.py, args...] or ["-m", module, args...]."""

    target: tuple[str, ...]
    time_scale: float = 1.0
    nic_gbps: float | None = None
    report_path: Path | None = None
    timeout_s: float | None = None
    grace_s: float = 5.0
    log_dir: Path | None = None  # each rank's stdout + stderr to log_dir/rank<r>.log (None: inherited)


@dataclass(frozen=True)
class LaunchResult:
    exit_code: int
    rank_codes: tuple[int, ...]
    timed_out: bool
    report: dict[str, Any] | None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_env(rank: int, world: int, port: int, config_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
                "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "TORCHELASTIC_RUN_ID": "geotrain-emulate", CONFIG_ENV: str(config_path),
                "GEOTRAIN_EMULATE_LAUNCHER_PID": str(os.getpid())})
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def exit_code_of(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _stop(processes: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every live child, wait up to `grace_s`, then SIGKILL and reap."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _supervise(processes: Sequence[subprocess.Popen], config: LaunchConfig, stopped: set[int]) -> bool:
    """Wait for all children; stop the rest when one fails or time runs out (their indices go to
    `stopped`). True if timed out."""
    deadline = None if config.timeout_s is None else time.monotonic() + config.timeout_s
    failed_at = None
    while any(p.poll() is None for p in processes):
        now = time.monotonic()
        if deadline is not None and now > deadline:
            _stop(processes, 2.0)
            return True
        if failed_at is None and any(p.returncode not in (None, 0) for p in processes):
            failed_at = now
        if failed_at is not None and now - failed_at > config.grace_s:
            stopped.update(i for i, p in enumerate(processes) if p.poll() is None)
            _stop(processes, 2.0)
        time.sleep(0.05)
    return False


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _install_stop_handlers() -> dict[int, Any]:
    """SIGINT, SIGTERM and SIGHUP stop the children (even where SIGINT was ignored, as for `cmd &`)."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _interrupt)
    return previous


def launch(cluster: Cluster, devices: Sequence[int], config: LaunchConfig) -> LaunchResult:
    """Run `config.target` on len(devices) ranks, rank i emulating devices[i]; merge the report."""
    network = EmulatedNetwork.from_cluster(cluster, config.time_scale, config.nic_gbps)
    device_list = check_device_list(devices, network.n_devices)
    with tempfile.TemporaryDirectory(prefix="geotrain-emulate-") as tmp:
        parts = Path(tmp) / "parts"
        parts.mkdir()
        config_path = Path(tmp) / "config.json"
        config_path.write_text(json.dumps({
            "cluster": cluster_to_dict(cluster, "dense"), "devices": device_list, "time_scale": config.time_scale,
            "nic_gbps": config.nic_gbps, "report_dir": str(parts) if config.report_path else None}))
        port = free_port()
        command = [sys.executable, "-m", "geotrain.emulate.bootstrap", *config.target]
        processes: list[subprocess.Popen] = []
        previous = _install_stop_handlers()
        try:
            for rank in range(len(device_list)):
                log = None if config.log_dir is None else open(config.log_dir / f"rank{rank}.log", "wb")  # noqa: SIM115
                try:
                    processes.append(subprocess.Popen(command, env=rank_env(rank, len(device_list), port, config_path),
                                                      preexec_fn=set_parent_death_signal, stdout=log,
                                                      stderr=None if log is None else subprocess.STDOUT))
                finally:
                    if log is not None:
                        log.close()
            stopped: set[int] = set()
            timed_out = _supervise(processes, config, stopped)
        except BaseException:
            _stop(processes, 2.0)
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        codes = tuple(exit_code_of(p.returncode) for p in processes)
        report = None
        if config.report_path is not None:
            report = merge_report(parts, cluster, device_list, config.time_scale)
            config.report_path.write_text(json.dumps(report, indent=1))
    worst = 124 if timed_out else max((c for i, c in enumerate(codes) if i not in stopped), default=0)
    return LaunchResult(worst, codes, timed_out, report)
