"""The child side of `geotrain emulate`: install the emulation, then run the user's script as `python` would.

Run as `python -m geotrain.emulate.bootstrap (SCRIPT.py | -m MODULE) [ARGS...]` with the launcher's
environment: torchrun's variables plus GEOTRAIN_EMULATE_CONFIG, a JSON file
{"cluster": <cluster dict>, "devices": [...], "time_scale": F, "nic_gbps": G|null, "report_dir": D|null}.
The process dies with its launcher (PR_SET_PDEATHSIG, and a thread that watches the parent).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path

from geotrain.cluster import cluster_from_dict
from geotrain.emulate.install import install
from geotrain.emulate.lifetime import die_with_parent

CONFIG_ENV = "GEOTRAIN_EMULATE_CONFIG"


def watch_parent(parent_pid: int, period_s: float = 0.5) -> None:
    """Exit at once if the launcher goes away (belt and braces for PR_SET_PDEATHSIG)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(period_s)
        os._exit(137)
    threading.Thread(target=watch, daemon=True, name="geotrain-parent-watch").start()


def main(argv: list[str]) -> None:
    die_with_parent()
    launcher = int(os.environ.get("GEOTRAIN_EMULATE_LAUNCHER_PID", os.getppid()))
    if os.getppid() != launcher:
        os._exit(137)
    watch_parent(launcher)
    config = json.loads(Path(os.environ[CONFIG_ENV]).read_text())
    install(cluster_from_dict(config["cluster"], os.environ[CONFIG_ENV]), config["devices"],
            config["time_scale"], config.get("nic_gbps"), config.get("report_dir"))
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
