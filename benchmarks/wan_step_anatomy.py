"""Where a bench wan row's time goes, step by step: each step's emulated seconds (the slowest rank's, as
bench wan counts them) beside its compute seconds, for the limit row and local SGD rows on wan-4x1.

    PYTHONPATH=src python benchmarks/wan_step_anatomy.py [ROW ...] [--steps 60] [--show 30] [--json OUT.json]

ROW: limit (fp32 DDP, zero-cost links), blocking (local SGD H=5, int8-block+EF outer: bench row 12),
eager (row 18: eager landing tau=2, warm-up 10), eager-int4 (the same with int4-block), moments and
eager-moments (rows 20 and 21: moment sync, int4-block, blocking and eager tau=2, warm-up 10),
eager-moments-first2 (row 23: the moments in the 2 warm-up syncs only) and eager-moments-first1 (in the
first sync only). Every other
setting is bench wan's default (tiny GPT, batch 8 per replica in 4 micro-batches, lr 3e-3, time scale
1e-3, CPU compute clock). A blocking sync shows as one long step; an overlapped one as a short stall
where it lands (tau steps after it starts) when the exchange outlasts the tau steps it overlaps.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import numpy as np

from geotrain.bench.wan import emulated_step_seconds
from geotrain.bench.wan_metrics import zero_cost_links
from geotrain.bench.wan_rows import WAN_CLUSTER
from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig, launch
from geotrain.runtime import checkpoint as ckpt

LOCAL_SGD = {"sync_every": 5, "outer_lr": 1.0, "outer_momentum": 0.0}
EAGER = {**LOCAL_SGD, "sync_delay": 2, "sync_landing": "eager", "sync_warmup": 10}
ROWS: dict[str, dict] = {
    "limit": {},
    "blocking": {**LOCAL_SGD, "dp_codec": "int8-block"},
    "eager": {**EAGER, "dp_codec": "int8-block"},
    "eager-int4": {**EAGER, "dp_codec": "int4-block"},
    "moments": {**LOCAL_SGD, "dp_codec": "int4-block", "sync_moments": True},
    "eager-moments": {**EAGER, "dp_codec": "int4-block", "sync_moments": True},
    "eager-moments-first2": {**EAGER, "dp_codec": "int4-block", "sync_moments": True, "moment_syncs": 2},
    "eager-moments-first1": {**EAGER, "dp_codec": "int4-block", "sync_moments": True, "moment_syncs": 1},
}
"""Row name -> RuntimeConfig settings beyond the bench's (the limit row also frees every link)."""


def step_anatomy(row: str, steps: int) -> dict[str, list[float]]:
    """Per step: emulated seconds (bench.wan.emulated_step_seconds) and the slowest rank's compute seconds."""
    cluster = load_cluster(WAN_CLUSTER)
    if row == "limit":
        cluster = zero_cost_links(cluster)
    replicas = cluster.n_devices
    with tempfile.TemporaryDirectory(prefix="geotrain-anatomy-") as directory:
        # checkpoint_every 0: only the run's end is saved (a sync in flight cannot be), its records with it
        config = RuntimeConfig.of(cluster, np.arange(replicas).reshape(1, replicas), row, steps=steps,
                                  microbatches=4, batch_size=8, lr=3e-3, time_scale=1e-3, compute_clock="cpu",
                                  checkpoint_dir=directory, checkpoint_every=0, **ROWS[row])
        launch(config)
        manifest = ckpt.read_manifest(directory, steps)
        records = [record for rank in range(replicas)
                   for record in ckpt.load_shard(directory, steps, rank, manifest,
                                                 {"rank": rank, "stage": 0, "replica": rank})["records"]]
    compute = np.zeros(steps)
    for record in records:
        compute[record["step"]] = max(compute[record["step"]], record["compute_s"])
    return {"emulated_s": emulated_step_seconds(records, steps).tolist(), "compute_s": compute.tolist()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", default=["limit", "blocking", "eager"], choices=sorted(ROWS))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--show", type=int, default=30, help="steps printed per row")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)
    results = {}
    for row in args.rows:
        anatomy = results[row] = step_anatomy(row, args.steps)
        emulated, compute = np.array(anatomy["emulated_s"]), np.array(anatomy["compute_s"])
        print(f"{row}: mean step {emulated[1:].mean():.4f} s, mean compute {compute[1:].mean():.4f} s")
        print("  emulated s:", " ".join(f"{x:.3f}" for x in emulated[:args.show]))
        print("  compute s: ", " ".join(f"{x:.3f}" for x in compute[:args.show]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
