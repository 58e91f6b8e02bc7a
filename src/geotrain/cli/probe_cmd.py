"""`geotrain probe`: run under torchrun (one process per host/GPU) or `geotrain netlab run`; measures
latency and bandwidth between all processes, finds regions, and (rank 0) writes a cluster file that
`geotrain plan --cluster` reads as it is.

    torchrun --nnodes 4 --nproc-per-node 1 ... -m geotrain probe --out cluster.yaml

With --json, rank 0 prints ONE JSON object: {"cluster": <dense cluster document>, "probe": {date,
settings, regions {metric, cut, gap_ratio, labels}, hosts, latency_ms, bandwidth_gbps_directed, ...}}.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from geotrain.cli.arg_types import output_file
from geotrain.cli.help_format import DefaultsHelpFormatter
from geotrain.errors import GeotrainError


class ProbeError(GeotrainError, RuntimeError):
    """`geotrain probe` was started outside torchrun or with bad options."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "probe", help="measure latency and bandwidth between torchrun processes; write a cluster file",
        description="Measure the network between torch.distributed processes (start it with torchrun or "
                    "`geotrain netlab run`), group them into regions, write a cluster file.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--out", type=output_file, metavar="CLUSTER.yaml", help="cluster file to write (rank 0); default: none")
    parser.add_argument("--name", help="cluster name (default: probe-<UTC date>)")
    parser.add_argument("--pings", type=int, default=20, help="ping-pongs per pair (latency = median RTT / 2)")
    parser.add_argument("--bytes", type=int, default=50_000_000, dest="n_bytes",
                        help="first transfer per direction, bytes (later ones grow up to 4x to last --min-seconds)")
    parser.add_argument("--repeats", type=int, default=3, help="counted transfers per direction (median)")
    parser.add_argument("--min-seconds", type=float, default=0.25, help="target duration of a counted transfer")
    parser.add_argument("--latency-noise-ms", type=float, default=1.0,
                        help="latency differences below this are noise (region clustering floor)")
    parser.add_argument("--backend", default="gloo", choices=("gloo",),
                        help="torch.distributed backend (gloo: CPU tensors over TCP, what the network gives)")
    parser.add_argument("--json", action="store_true", help="rank 0 prints one JSON object instead of tables")
    parser.set_defaults(handler=run)


def _check(args: Any) -> None:
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise ProbeError(f"geotrain probe: environment variable {key} is unset: start it with torchrun "
                             "or `geotrain netlab run -- -m geotrain probe ...`")
    for option, value, low in (("--pings", args.pings, 1), ("--bytes", args.n_bytes, 1), ("--repeats", args.repeats, 1)):
        if value < low:
            raise ProbeError(f"geotrain probe: {option} must be >= {low}, got {value}")
    if args.min_seconds < 0 or args.latency_noise_ms < 0:
        raise ProbeError("geotrain probe: --min-seconds and --latency-noise-ms must be >= 0")


def run(args: Any) -> int:
    _check(args)
    import torch
    import torch.distributed as dist

    from geotrain.cli.output import Output
    from geotrain.cluster import cluster_from_dict
    from geotrain.cluster.gpus import UNKNOWN_GPU, gpu_type_of
    from geotrain.probe import (ProbeConfig, cluster_document, cluster_yaml, device_names, measure_all,
                                probe_record, region_summary, regions_from_measurements)

    config = ProbeConfig(pings=args.pings, n_bytes=args.n_bytes, repeats=args.repeats, min_seconds=args.min_seconds)
    dist.init_process_group(args.backend)
    try:
        measured = measure_all(config)
        local_ranks: list[Any] = [None] * dist.get_world_size()
        gpu = gpu_type_of(torch.cuda.get_device_name()) if torch.cuda.is_available() else UNKNOWN_GPU  # a file's type
        dist.all_gather_object(local_ranks, (int(os.environ.get("LOCAL_RANK", 0)), gpu))
    finally:
        dist.destroy_process_group()
    if int(os.environ["RANK"]) != 0:
        return 0
    date = datetime.now(timezone.utc)
    split = regions_from_measurements(measured.latency_min_ms, measured.bandwidth_gbps, args.latency_noise_ms)
    names = device_names(measured.hosts, tuple(local for local, _ in local_ranks))
    doc = cluster_document(measured, split, names, [gpu for _, gpu in local_ranks],
                           args.name or f"probe-{date:%Y%m%dT%H%MZ}")
    record = probe_record(measured, split, config, date)
    if args.out:
        Path(args.out).write_text(cluster_yaml(doc, record))
    out = Output(json_mode=args.json)
    if args.json:
        out.emit_json({"cluster": doc, "probe": record})
        return 0
    cluster = cluster_from_dict(doc, "<probe>")
    out.table(f"measured network ({len(names)} processes, regions by {split.metric})",
              ["link class", "pairs", "mean Gbit/s", "min Gbit/s", "mean ms"], region_summary(cluster))
    out.table("devices", ["device", "region", "host"],
              [[d["name"], d["region"], host] for d, host in zip(doc["devices"], measured.hosts)])
    if args.out:
        out.text(f"wrote {args.out}")
    return 0
