"""Start one process per emulated device, as `torchrun --standalone` would, and wait for them.

Each child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR,
MASTER_PORT (the rendezvous store, hosted by the launcher as torchrun's agent hosts it), OMP_NUM_THREADS=1 unless
set (as torchrun), and runs geotrain.emulate.bootstrap, which
installs the emulation and runs the script. If a child fails the others get `grace_s` to finish, then
SIGTERM, then SIGKILL; the same on timeout (exit 124) and Ctrl-C (exit 130). Children, with whatever
they start, die with the launcher (geotrain.procs.Supervisor). Exit code: the worst child's (a
signal-killed child counts as 128 + signal), among the children that ended on their own: ranks the
launcher stopped after a failure do not mask its code.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geotrain.cluster import Cluster, cluster_to_dict
from geotrain.cluster.devices import check_device_list
from geotrain.emulate.bootstrap import CONFIG_ENV
from geotrain.emulate.network import EmulatedNetwork
from geotrain.emulate.report import merge_report
from geotrain.procs import Command, LaunchResult, Supervisor, torchrun_env


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
    compute_scale: tuple[float, ...] | None = None
    """One factor per cluster device: the rank on device d counts that many times its measured compute
    (install's compute_scale; None: all 1)."""
    compute_clock: str = "wall"
    """How each rank's emulated clock counts compute: wall or CPU seconds (install.COMPUTE_CLOCKS)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_env(rank: int, world: int, port: int, config_path: Path) -> dict[str, str]:
    """A rank's environment: torchrun's variables, the store at `port` hosted by the launcher (torchrun's agent
    store: TORCHELASTIC_USE_AGENT_STORE, so every rank is its client), and the emulation's config."""
    return torchrun_env(rank, world, "127.0.0.1", port, TORCHELASTIC_RUN_ID="geotrain-emulate",
                        TORCHELASTIC_USE_AGENT_STORE="True",
                        **{CONFIG_ENV: str(config_path), "GEOTRAIN_EMULATE_LAUNCHER_PID": str(os.getpid())})


def launcher_store(world: int) -> Any:
    """The rendezvous store of the ranks, hosted in the launcher as torchrun's agent hosts it: a script whose rank 0
    ends right after init_process_group does not take the store away from a peer still connecting."""
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)


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
            "nic_gbps": config.nic_gbps, "report_dir": str(parts) if config.report_path else None,
            "compute_scale": None if config.compute_scale is None else list(config.compute_scale),
            "compute_clock": config.compute_clock}))
        command = (sys.executable, "-m", "geotrain.emulate.bootstrap", *config.target)
        world = len(device_list)
        store = launcher_store(world)  # held until the ranks have ended
        specs = [Command(command, rank_env(rank, world, store.port, config_path),
                         None if config.log_dir is None else config.log_dir / f"rank{rank}.log")
                 for rank in range(world)]
        previous = _install_stop_handlers()
        try:
            with Supervisor(specs, grace_s=config.grace_s, term_s=2.0, timeout_s=config.timeout_s,
                            cleanup_paths=[Path(tmp)]) as supervisor:
                verdict = supervisor.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        report = None
        if config.report_path is not None:
            report = merge_report(parts, cluster, device_list, config.time_scale)
            config.report_path.write_text(json.dumps(report, indent=1))
    return LaunchResult(verdict, report, verdict.wall_s)
