"""`geotrain cluster show FILE|PRESET`: regions, GPUs and links as tables (--json: the cluster file form)."""

from __future__ import annotations

from typing import Any

import numpy as np

from geotrain.cli.output import Output
from geotrain.cluster import Cluster, cluster_to_dict, load_cluster


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("cluster", help="inspect clusters", description="Inspect clusters.")
    children = parser.add_subparsers(dest="cluster_command", metavar="NAME", required=True)
    show = children.add_parser("show", help="regions, devices, GPUs and links of a cluster file or preset",
                               description="Show a cluster's regions and region-pair links (Gbit/s, ms).")
    show.add_argument("spec", metavar="FILE|PRESET", help="cluster preset (seed-geo, ...) or YAML/JSON file")
    show.add_argument("--json", action="store_true", help="print the cluster as one JSON object (file form)")
    show.set_defaults(handler=run_show)


def link_summary(cluster: Cluster, a: int, b: int) -> tuple[str, str, int]:
    """(Gbit/s, ms, device pairs) between regions a and b; 'lo-hi' when the block is not uniform."""
    rows, cols = cluster.devices_in_region(a), cluster.devices_in_region(b)
    mask = ~np.eye(len(rows), dtype=bool) if a == b else np.ones((len(rows), len(cols)), dtype=bool)
    block = np.ix_(rows, cols)
    gbps, ms = cluster.bandwidth_gbps[block][mask], cluster.latency_ms[block][mask]
    if gbps.size == 0:
        return "-", "-", 0

    def span(values: np.ndarray) -> str:
        lo, hi = float(values.min()), float(values.max())
        return f"{lo:.3g}" if lo == hi else f"{lo:.3g}-{hi:.3g}"

    pairs = gbps.size // 2 if a == b else gbps.size
    return span(gbps), span(ms), pairs


def run_show(args: Any) -> int:
    out = Output(json_mode=args.json)
    cluster = load_cluster(args.spec)
    if args.json:
        out.emit_json(cluster_to_dict(cluster))
        return 0
    sizes = cluster.region_sizes()
    region_rows = []
    for r, name in enumerate(cluster.region_names):
        gpus = sorted({cluster.gpus[d] for d in cluster.devices_in_region(r)})
        gbps, ms, _ = link_summary(cluster, r, r)
        region_rows.append([name, int(sizes[r]), ", ".join(gpus), gbps, ms])
    out.table(f"{cluster.name}: {cluster.n_devices} devices in {cluster.n_regions} region(s)",
              ["region", "devices", "GPU", "intra Gbit/s", "intra ms"], region_rows, right_align_from=1)
    link_rows = []
    for a in range(cluster.n_regions):
        for b in range(a + 1, cluster.n_regions):
            gbps, ms, pairs = link_summary(cluster, a, b)
            link_rows.append([cluster.region_names[a], cluster.region_names[b], gbps, ms, pairs])
    if link_rows:
        out.table("links between regions", ["region", "region", "Gbit/s", "ms", "device pairs"], link_rows,
                  right_align_from=2)
    return 0
