"""Which cluster device each rank plays, from `--devices d0,d1,...` or `--plan PLAN.json`.

Shared by `geotrain emulate`, `geotrain netlab` and `bench netlab`: with a plan, rank s*R + r plays
assignment[s][r] (stage-major, as torch.distributed.pipelining numbers ranks); with a sharded plan (`plan --shards K`)
rank (s*R + r)*K + k plays `shards.devices[s][r][k]`, the K shards of a slot side by side. Range and uniqueness
against the cluster are checked by the caller's own model of the devices.
"""

from __future__ import annotations

from geotrain.cluster.devices import DeviceListError
from geotrain.errors import shown
from geotrain.plan import Plan


def parse_device_list(text: str) -> list[int]:
    """[0, 5, 9] from '0,5,9' (blank items skipped); DeviceListError otherwise."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DeviceListError(f"--devices: expected comma-separated device indices, got {shown(text)}") from None


def rank_devices(plan_path: str | None, devices_text: str | None, n_devices: int) -> list[int] | None:
    """The device of each rank from the plan file (stage-major) or the --devices text; None if neither."""
    if plan_path:
        plan = Plan.load(plan_path)
        assignment = plan.check_fits(n_devices, plan_path)
        devices = assignment if plan.shards is None else plan.shards.devices
        return [int(d) for d in devices.reshape(-1)]
    if devices_text is None:
        return None
    return parse_device_list(devices_text)
