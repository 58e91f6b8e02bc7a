"""Pre-started spare processes of an elastic run: a failed replica group restarts in a process that is already
running, instead of one the fork server starts after the failure (a new process took 1.5 to 7 s from the restart
to its first line on a loaded 2-core machine: seconds in which its group's slices are not trained).

    spare_main(config, result_dir, store_port, lighthouse, world, rank)   # supervisor rank `rank` of the launcher

A spare waits for the launcher's store key `spare_key(rank)`; the launcher sets it to the group it takes over (the
group's incarnation set first), and the spare then runs that group (runtime/elastic/group.py's `group_main`), as
its restarted process would. The launcher starts a new spare in the failed group's old slot. Spares run where a
group is one process on this host's network: pipeline S = 1 and no shards, no --netlab (a lab group lives in its device's
namespace).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from geotrain.procs import set_process_name
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.group import group_main
from geotrain.runtime.elastic.links import GroupNet

SPARES = 1
"""Spare processes of a run that restarts groups: one covers a failure at a time (a new one starts in the failed
group's slot at once)."""
SPARE_WAIT = timedelta(days=7)
"""How long a spare waits for a group (the launcher stops it with the run)."""


def spare_count(config: RuntimeConfig) -> int:
    """How many spares the launcher starts for `config`: SPARES where they run (a group of one process: S = 1 and
    K = 1; no --netlab) and groups are restarted (--max-restarts > 0), else 0."""
    from geotrain.runtime.elastic.stage import group_size

    rel = config.reliability
    return SPARES if group_size(config) == 1 and not rel.netlab and rel.max_restarts > 0 else 0


def spare_key(rank: int) -> str:
    """Launcher store key: the replica group the spare at supervisor rank `rank` takes over."""
    return f"spare/{rank}"


def spare_main(config: RuntimeConfig, result_dir: str, store_port: int, lighthouse: str | None, world: Any,
               rank: int) -> None:
    """Entry point of a spare (a supervisor Target): wait for a group, then be that group's process."""
    from torch.distributed import TCPStore

    set_process_name("geotrain-spare")
    net = GroupNet()
    store = TCPStore(net.store_host, store_port, is_master=False, timeout=SPARE_WAIT)
    store.wait([spare_key(rank)])
    group = int(store.get(spare_key(rank)).decode())
    del store
    group_main(config, group, result_dir, store_port, lighthouse, world, net)
