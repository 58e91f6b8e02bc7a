"""Hierarchical vs flat gradient compression at equal inter-region bytes, on an emulated geo cluster.

    PYTHONPATH=src python benchmarks/hierarchical_vs_flat.py \
        --cluster benchmarks/data/geo-2x4-100mbit.yaml --devices 0,1,2,3,4,5,6,7 --steps 150 --seeds 0,1,2 [--json OUT.json]

Rows, measurements and formulas: geotrain/bench/hierarchical.py; results: docs/hierarchical.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from geotrain.bench.hierarchical import HierBenchConfig, format_table, run_bench
from geotrain.cli.device_args import parse_device_list
from geotrain.cluster import load_cluster


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--devices", required=True, help="e.g. 0,1,2,3,4,5,6,7 (rank i plays device i; keep regions contiguous)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--only", default="", help="comma-separated parts of row labels to keep")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)
    cluster = load_cluster(args.cluster)
    devices = parse_device_list(args.devices)
    config = replace(HierBenchConfig(), steps=args.steps, batch=args.batch,
                     seeds=tuple(int(s) for s in args.seeds.split(",")))
    result = run_bench(cluster, devices, config, [o for o in args.only.split(",") if o])
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
