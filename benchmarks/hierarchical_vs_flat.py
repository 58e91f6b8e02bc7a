"""Hierarchical vs flat gradient compression at equal inter-region bytes, on an emulated geo cluster.

    PYTHONPATH=src python benchmarks/hierarchical_vs_flat.py \
        --cluster benchmarks/data/geo-2x4-100mbit.yaml --devices 0,1,2,3,4,5,6,7 --steps 150 --seeds 0,1,2 [--json OUT.json]

Rows, measurements and formulas: geotrain/bench/hierarchical.py; results: docs/history/hierarchical.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from geotrain.bench.hierarchical import HierBenchConfig, bench_result, format_table, run_bench
from geotrain.cli.device_args import parse_device_list
from geotrain.cluster import load_cluster
from geotrain.models import make_model


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--devices", required=True, help="e.g. 0,1,2,3,4,5,6,7 (rank i plays device i; keep regions contiguous)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--only", default="", help="comma-separated parts of row labels to keep")
    parser.add_argument("--json", metavar="OUT.json")
    parser.add_argument("--runs-jsonl", metavar="RUNS.jsonl", help="append each run's numbers here as it ends")
    parser.add_argument("--summarize", nargs="+", metavar="RUNS.jsonl",
                        help="only print the table of the runs in these files (e.g. one per seed, run in parallel)")
    args = parser.parse_args(argv)
    cluster = load_cluster(args.cluster)
    devices = parse_device_list(args.devices)
    config = replace(HierBenchConfig(), steps=args.steps, batch=args.batch,
                     seeds=tuple(int(s) for s in args.seeds.split(",")))
    if args.summarize:
        runs = [json.loads(line) for path in args.summarize for line in open(path) if line.strip()]
        n_params = sum(p.numel() for p in make_model(config.model, 0).parameters())
        result = bench_result(cluster.name, devices, config, n_params, runs)
    else:
        def keep(run: dict) -> None:
            print(json.dumps(run), file=sys.stderr, flush=True)
            if args.runs_jsonl:
                with open(args.runs_jsonl, "a") as handle:
                    handle.write(json.dumps(run) + "\n")
        result = run_bench(cluster, devices, config, [o for o in args.only.split(",") if o], keep)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
