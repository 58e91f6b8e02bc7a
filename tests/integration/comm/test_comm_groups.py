"""comm/groups.py: a group made by `new_group(ranks, timeout_s)` bounds its collectives by `timeout_s`, on gloo and
on the emulating backend (torch's own default for a new group is 30 minutes, whatever the world group got), and
every group geotrain creates is made there."""

from __future__ import annotations

import multiprocessing
import re
import time

import pytest

from paths import ROOT

WORLD_TIMEOUT_S, GROUP_TIMEOUT_S, LATE_S = 120.0, 2.0, 40.0


def _rank(rank: int, backend: str, store_path: str, results: multiprocessing.Queue) -> None:
    """Rank 1 comes LATE_S late to an all_reduce on a new group; rank 0 reports how long it waited and how it ended."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from geotrain.comm.groups import new_group

    if backend == "emulate":
        from geotrain.cluster.io import parse_cluster_text
        from geotrain.emulate import install
        from two_gpus import TWO_GPUS_YAML

        install(parse_cluster_text(TWO_GPUS_YAML), [0, 1], time_scale=0)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=WORLD_TIMEOUT_S))
    group = new_group([0, 1], GROUP_TIMEOUT_S)
    if rank == 1:
        time.sleep(LATE_S)
        return
    started = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(4), group=group)
        outcome = "returned"
    except RuntimeError as exc:
        outcome = str(exc)
    results.put((time.perf_counter() - started, outcome, type(group).__name__))


@pytest.mark.timeout(120)
def test_a_new_groups_collective_waits_its_timeout_not_torchs_default(tmp_path):
    context = multiprocessing.get_context("spawn")
    queues = {backend: context.Queue() for backend in ("gloo", "emulate")}  # both pairs at once: one start-up
    ranks = [context.Process(target=_rank, args=(r, backend, str(tmp_path / f"store-{backend}"), queue))
             for backend, queue in queues.items() for r in range(2)]
    for process in ranks:
        process.start()
    try:
        found = {backend: queue.get(timeout=60) for backend, queue in queues.items()}
    finally:
        for process in ranks:
            process.kill()
            process.join()
    for backend, (waited_s, outcome, group_type) in found.items():
        assert GROUP_TIMEOUT_S - 0.5 < waited_s < GROUP_TIMEOUT_S + 5, (backend, waited_s, outcome)
        assert "Timed out" in outcome or "timeout" in outcome.lower(), outcome
    assert found["emulate"][2] == "EmulatedProcessGroup" and found["gloo"][2] == "ProcessGroup"


def test_every_process_group_geotrain_creates_is_made_by_comm_groups():
    """dist.new_group (torch's 30-minute default) only in comm/groups.py (emulate/install.py wraps it)."""
    made_elsewhere = [f"{path.relative_to(ROOT)}:{number}"
                      for path in sorted((ROOT / "src" / "geotrain").rglob("*.py"))
                      if path.name != "groups.py" and path.parent.name != "emulate"
                      for number, line in enumerate(path.read_text().splitlines(), 1)
                      if re.search(r"\b(dist|c10d|distributed)\.new_(sub)?groups?\(", line)]
    assert made_elsewhere == []
    assert "timeout=collective_timeout(timeout_s)" in (ROOT / "src" / "geotrain" / "comm" / "groups.py").read_text()
