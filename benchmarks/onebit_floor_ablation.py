"""OneBitAdam vs AdamW, its effects separated: variance floor, frozen variance, 1-bit compression.

    PYTHONPATH=src python benchmarks/onebit_floor_ablation.py --seeds 0,1,2 --steps 300 [--json OUT.json]

Rows (the compression demo's table (c), geotrain.demos.compress, without its sign row): AdamW fp32;
AdamW + OneBitAdam's variance floor (geotrain.optim.floored_adamw); + frozen variance at 5%;
OneBitAdam (5% warm-up, floor 0.1). Same model, data, workers (4), batch (32) and seed per column.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

import torch

from geotrain.demos.compress import ONEBIT_TABLE, CompressDemoConfig, run_compress_demo


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as the demo's runs: one thread each (two threads on a busy machine spin)
    table = replace(ONEBIT_TABLE, runs=tuple(r for r in ONEBIT_TABLE.runs if r.key != "sign"))
    results: dict[str, list[float]] = {run.label: [] for run in table.runs}
    for seed in (int(s) for s in args.seeds.split(",")):
        demo = run_compress_demo(CompressDemoConfig(steps=args.steps, seed=seed, tables=(table,)))
        for row in demo.table_rows(table.key):
            results[row.label].append(row.val_bpc)
            print(f"seed {seed}: {row.label}: {row.val_bpc:.4f} bpc", file=sys.stderr, flush=True)
    print(f"{'row':52s} {'val bpc per seed':>26s} {'mean':>7s}")
    for label, values in results.items():
        print(f"{label:52s} {' '.join(f'{v:.4f}' for v in values):>26s} {sum(values) / len(values):7.4f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"steps": args.steps, "seeds": args.seeds, "val_bpc": results}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
