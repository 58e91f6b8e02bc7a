"""Summarise benchmarks/cuda/check.sh's runs (each NAME.json a `geotrain train --json` report): one row per
run, then how far the CUDA losses sit from the CPU fp32 run's (same seed and data). Usage: summarise.py DIR"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def row(path: Path) -> dict | None:
    """A run's report -> its summary row (None: the run wrote no report)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    # an elastic report (--elastic) has no iterations: group 0's step records, each with its wall seconds
    iterations = report.get("iterations") or [{"iteration_s": r["wall_s"]} for r in report["group_records"]["0"]]
    steady = [it["iteration_s"] for it in iterations[len(iterations) // 3:]]  # past warm-up and autotuning
    config = report["config"]
    tokens = config["batch_size"] * report["replicas"] * config["seq_len"]
    step_s = statistics.median(steady)
    validation = report["validation"][-1]["loss"] if report["validation"] else None
    return {"run": path.stem, "steps": len(iterations), "first_loss": report["losses"][0],
            "final_loss": report["losses"][-1], "val_loss": validation, "median_step_ms": 1e3 * step_s,
            "tokens_per_s": tokens / step_s, "wall_s": report["wall_s"],
            "losses": report["losses"], "memory": report["summary"].get("memory")}


def main(folder: str) -> None:
    rows = [r for r in (row(p) for p in sorted(Path(folder).glob("*.json")) if not p.stem.startswith("plan"))
            if r is not None]
    print(f"{'run':<22} {'steps':>5} {'first':>7} {'final':>7} {'val':>7} {'step ms':>8} {'tok/s':>9} {'wall s':>7}")
    for r in rows:
        val = f"{r['val_loss']:.4f}" if r["val_loss"] is not None else "-"
        tps = f"{r['tokens_per_s']:.0f}"
        print(f"{r['run']:<22} {r['steps']:>5} {r['first_loss']:>7.4f} {r['final_loss']:>7.4f} {val:>7} "
              f"{r['median_step_ms']:>8.1f} {tps:>9} {r['wall_s']:>7.1f}")
    by_name = {r["run"]: r for r in rows}
    pairs = [(name, "tiny-cpu-fp32") for name in ("tiny-cuda-fp32", "tiny-cuda-bf16", "tiny-cpu-bf16")]
    pairs.append(("sharded-1x2x2-cuda", "sharded-1x2x2-cpu"))  # FSDP2 over NCCL inside a site against gloo
    pairs.append(("v-streaming-host", "v-streaming"))  # --outer-state host (pinned host anchors) against device
    pairs.append(("elastic-cuda", "elastic-cpu"))  # torchft groups on GPUs (host copies on gloo) against CPU
    pairs.append(("elastic-sharded-cuda", "elastic-sharded-cpu"))  # S x K = 2 groups, a kill each (not bit-exact)
    for name, base in pairs:
        reference = by_name.get(base)
        if reference and name in by_name:
            gaps = [abs(a - b) for a, b in zip(by_name[name]["losses"], reference["losses"])]
            print(f"{name} vs {base}: |loss gap| step 0 {gaps[0]:.2e}, max {max(gaps):.2e}, "
                  f"last {gaps[-1]:.2e}")
    # what each rank held (summary.memory): its state against the planner's, and the GPU's peak where there is one
    print(f"{'run':<22} {'state MB':>9} {'on host MB':>10} {'planner MB':>10} {'peak GPU MB':>11} {'peak RSS GB':>11}")
    for r in rows:
        memory = r["memory"]
        if not memory:
            continue
        top = max(memory["per_rank"], key=lambda rank: rank["state"])
        planner = "-" if top["predicted_state"] is None else f"{top['predicted_state'] / 1e6:.2f}"
        device = max((rank.get("peak_device") or 0) for rank in memory["per_rank"])
        print(f"{r['run']:<22} {top['state'] / 1e6:>9.2f} {top.get('host', 0) / 1e6:>10.2f} {planner:>10} "
              f"{device / 1e6 if device else 0:>11.1f} "
              f"{max(rank['peak_rss'] for rank in memory['per_rank']) / 1e9:>11.2f}")
    json.dump(rows, open(Path(folder) / "summary.json", "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
