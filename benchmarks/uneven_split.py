"""Predicted iteration seconds with the equal vs the speed-optimal uneven layer split on mixed-GPU clusters.

    PYTHONPATH=src python benchmarks/uneven_split.py [--json OUT.json]

For each cluster, layout and compute-aware cost model ("yuan+compute", "schedule"; job gpt-1.3b-seed):
the best placement under the equal split and the best under the uneven split (cost/layer_split.py,
`geotrain plan --uneven-split`), each scored with both splits. mixed-gpus-3x2 (examples/clusters/:
A100, V100, T4 x 2) is searched exhaustively (all 720 placements) under each model; on
multicloud(8, 8, seed=0) (T4 x24, L4 x16, A100/H100/A10G x8) `genetic` (seed 0, a fixed budget: same
output on every machine) searches under "yuan+compute" only and "schedule" scores its placements (one
"schedule" evaluation simulates 2 S M = 1024 pipeline ops: too slow to search with here). A fixed
"stage per region" placement (each stage one region's 8 GPUs: H100, A100, A10G, L4) shows a pipeline
across GPU generations.
Results: docs/history/placement.md ("Uneven split").
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

from geotrain.cluster import Cluster, load_cluster
from geotrain.cluster.scale import multicloud
from geotrain.cost import build_cost_model
from geotrain.job import GPT_13B_SEED
from geotrain.search import PlacementProblem, run_search

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("yuan+compute", "schedule")
GENETIC = {"children": 40, "improve_swaps": 300}


def best_placement(cluster: Cluster, stages: int, replicas: int, name: str, uneven: bool) -> np.ndarray:
    """The best placement of the cost model `name` (with or without the speed split): exhaustive up to
    8 devices, else genetic with a fixed budget under "yuan+compute"."""
    if cluster.n_devices > 8:
        name = "yuan+compute"
    model = build_cost_model(name, cluster, GPT_13B_SEED, stages, replicas, layer_shares="speed" if uneven else None)
    if cluster.n_devices <= 8:
        every = np.array([p[:stages * replicas] for p in itertools.permutations(range(cluster.n_devices))])
        every = every.reshape(-1, stages, replicas)
        return every[int(np.argmin(model.evaluate_many(every)))]
    return run_search("genetic", PlacementProblem(cluster, model), seed=0, options=GENETIC).assignment


def rows_for(label: str, cluster: Cluster, stages: int, replicas: int,
             fixed: dict[str, np.ndarray] | None = None) -> list[dict]:
    rows = []
    found: dict[tuple[str, str], np.ndarray] = {}
    for name in MODELS:
        equal = build_cost_model(name, cluster, GPT_13B_SEED, stages, replicas)
        uneven = build_cost_model(name, cluster, GPT_13B_SEED, stages, replicas, layer_shares="speed")
        searched_by = name if cluster.n_devices <= 8 else "yuan+compute"
        placements = {}
        for searched in ("equal", "uneven"):
            key = (searched_by, searched)
            if key not in found:
                found[key] = best_placement(cluster, stages, replicas, name, searched == "uneven")
            placements[f"best, {searched} split"] = found[key]
        placements.update(fixed or {})
        for searched, assignment in placements.items():
            split = uneven.shares.describe(assignment)
            by = searched_by if searched.startswith("best") else "fixed"
            rows.append({"cluster": label, "layout": f"{stages}x{replicas}", "cost_model": name,
                         "searched_by": by,
                         "placement_searched_with": searched, "assignment": assignment.tolist(),
                         "stage_tflops": split["stage_tflops"], "counts": split["counts"],
                         "equal_split_s": equal.evaluate(assignment).total,
                         "uneven_split_s": uneven.evaluate(assignment).total})
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = ["| cluster (S x R) | cost model | placement | stage TFLOP/s (slowest GPU) | layers per stage "
             "(uneven) | equal split s | uneven split s | speed-up |", "|" + "---|" * 8]
    for row in rows:
        tflops = "/".join(f"{t:g}" for t in row["stage_tflops"])
        counts = "/".join(str(c) for c in row["counts"])
        by = "" if row["searched_by"] in (row["cost_model"], "fixed") else f" (by {row['searched_by']})"
        lines.append(f"| {row['cluster']} ({row['layout']}) | {row['cost_model']} | {row['placement_searched_with']}"
                     f"{by} | {tflops} | {counts} | {row['equal_split_s']:.2f} | {row['uneven_split_s']:.2f} | "
                     f"{row['equal_split_s'] / row['uneven_split_s']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)
    rows = rows_for("mixed-gpus-3x2", load_cluster(ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml"), 3, 2)
    by_region = np.arange(64).reshape(8, 8)[[2, 1, 7, 3]]  # us-central H100, us-west A100, sa-east A10G, eu-west L4
    rows += rows_for("multicloud(8, 8, seed=0)", multicloud(8, 8, seed=0), 4, 8,
                     {"stage per region (H100, A100, A10G, L4)": by_region})
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"job": GPT_13B_SEED.name, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
