"""The child side of `geotrain emulate`: install the emulation, then run the user's script as `python` would.

Run as `python -m geotrain.emulate.bootstrap (SCRIPT.py | -m MODULE) [ARGS...]` with the launcher's
environment: torchrun's variables plus GEOTRAIN_EMULATE_CONFIG, a JSON file
{"cluster": <cluster dict>, "devices": [...], "time_scale": F, "nic_gbps": G|null, "report_dir": D|null,
"compute_scale": [one factor per cluster device]|null, "compute_clock": "wall"|"cpu"}.
The process dies with its launcher (geotrain.procs.die_with_parent).
"""

from __future__ import annotations

import json
import os
import re
import runpy
import sys
from pathlib import Path

from geotrain.cluster import cluster_from_dict
from geotrain.emulate.install import install
from geotrain.procs import EXIT_PEER_LOST, die_with_parent
from geotrain.procs.exit import exit_without_teardown

CONFIG_ENV = "GEOTRAIN_EMULATE_CONFIG"
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused")


def _lost_a_peer(exc: BaseException) -> bool:
    """True for the errors gloo raises in a rank whose peer died (its socket closed)."""
    text = str(exc)
    return any(marker in text for marker in _PEER_LOST)


def main(argv: list[str]) -> None:
    die_with_parent(int(os.environ.get("GEOTRAIN_EMULATE_LAUNCHER_PID", os.getppid())))
    config = json.loads(Path(os.environ[CONFIG_ENV]).read_text())
    install(cluster_from_dict(config["cluster"], os.environ[CONFIG_ENV]), config["devices"],
            config["time_scale"], config.get("nic_gbps"), config.get("report_dir"),
            compute_clock=config.get("compute_clock", "wall"), compute_scale=config.get("compute_scale"))
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except Exception as exc:
        if not _lost_a_peer(exc):
            raise  # the script's own error: its traceback is what its author needs
        # Another rank died (the launcher names it): one line here, not a traceback per survivor.
        first = re.sub(r"^\[[^\]]*\]\s*", "", (str(exc).strip().splitlines() or [""])[0]).split(". ")[0][:200]
        print(f"geotrain emulate rank {os.environ.get('RANK', '?')}: lost a peer: {first}", file=sys.stderr)
        code = EXIT_PEER_LOST
    # The script is done: run its exit handlers (our report among them), then leave without the
    # interpreter's teardown, where destroying gloo's threads out of order has aborted a rank
    # ("terminate called without an active exception", exit 134) after a successful run. Threads are
    # not joined, as before: torch's own may never end.
    exit_without_teardown(code, join_threads=False)


if __name__ == "__main__":
    main(sys.argv[1:])
