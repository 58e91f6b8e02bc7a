"""Hierarchical vs flat gradient compression on an emulated geo cluster, at equal inter-region bytes.

Every row trains the same tiny GPT (same seed, same batches) with DDP under `geotrain emulate`
(time scale 0: emulated times only, no sleeping) and reports, per seed: validation bits per character
after `steps` steps, emulated seconds per step (barrier to barrier, compute included at this machine's
speed), emulated communication seconds per step (the longest union over ranks of the spans of the
collectives a rank took part in: link time only) and the bytes the emulator saw cross regions.

Ranks are placed region by region (the ring of a flat collective crosses regions R times). Rows:
fp32 DDP; flat sign+EF and flat top-k+EF (geotrain's codec hook: every rank all-gathers every rank's
payload); hierarchical sign+EF, int8+EF and top-k+EF (geotrain.comm.hierarchical, sharded). The two
top-k fractions are chosen so that their inter-region bytes equal flat sign+EF's (formulas in
`equal_byte_fractions`), so the table compares quality at equal inter-region bytes.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from geotrain.cluster import Cluster
from geotrain.comm.regions import regions_of_devices
from geotrain.models import TINY_2LAYER_GPT, GPTConfig, make_model


@dataclass(frozen=True)
class HierRow:
    """One way of exchanging gradients: mode fp32 | flat | hier, a codec and its parameters."""

    label: str
    mode: str
    codec: str = "none"
    codec_params: dict[str, Any] = field(default_factory=dict)
    error_feedback: bool = True
    sharded: bool = True


@dataclass(frozen=True)
class HierBenchConfig:
    """Steps per run, global batch (sequences), seeds, model, peak lr, timeout per run (s)."""

    steps: int = 150
    batch: int = 32
    seeds: tuple[int, ...] = (0, 1, 2)
    model: GPTConfig = TINY_2LAYER_GPT
    lr: float = 3e-3
    timeout_s: float = 1200.0


def sign_payload_bytes(sizes: Sequence[int]) -> int:
    """Bytes of one rank's per-tensor sign payload: ceil(n / 8) + 4 per tensor."""
    return sum(-(-n // 8) + 4 for n in sizes)


def equal_byte_fractions(sizes: Sequence[int], world: int, regions: int) -> tuple[float, float]:
    """(flat, hierarchical) top-k fractions whose inter-region bytes equal flat sign+EF's.

    Flat all-gather over `world` ranks in `regions` blocks: regions x (world - 1) payloads cross regions
    (sign: sign_payload_bytes; top-k: 8 bytes per kept value, ~8 f n). Hierarchical: regions x (regions - 1)
    payloads of the whole vector (summed over the shards), ~8 f n each."""
    n, flat_sign = sum(sizes), regions * (world - 1) * sign_payload_bytes(sizes)
    return flat_sign / (regions * (world - 1) * 8 * n), flat_sign / (regions * (regions - 1) * 8 * n)


def bench_rows(sizes: Sequence[int], world: int, regions: int) -> list[HierRow]:
    flat_f, hier_f = equal_byte_fractions(sizes, world, regions)
    return [
        HierRow("fp32 DDP (ring all-reduce)", "fp32"),
        HierRow("flat sign+EF", "flat", "sign"),
        HierRow(f"flat top-{100 * flat_f:.2f}%+EF (= flat sign bytes)", "flat", "topk", {"fraction": flat_f}),
        HierRow("hier sign+EF", "hier", "sign"),
        HierRow("hier int8+EF", "hier", "int8"),
        HierRow(f"hier top-{100 * hier_f:.1f}%+EF (= flat sign bytes)", "hier", "topk", {"fraction": hier_f}),
    ]


def _comm_s(report: dict[str, Any], after_s: float, before_s: float) -> float:
    """Longest union over ranks of the spans of the non-barrier collectives it joined within
    [after_s, before_s] (emulated seconds)."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for op in report["ops"]:
        if op["op"] != "barrier" and op["start_s"] >= after_s and op["end_s"] <= before_s:
            for rank in op["ranks"]:
                spans.setdefault(rank, []).append((op["start_s"], op["end_s"]))
    best = 0.0
    for intervals in spans.values():
        total, end = 0.0, float("-inf")
        for start, stop in sorted(intervals):
            if stop > end:
                total += stop - max(start, end)
                end = stop
        best = max(best, total)
    return best


def run_row(cluster: Cluster, devices: Sequence[int], row: HierRow, seed: int, config: HierBenchConfig) -> dict[str, Any]:
    """Train one row for one seed under the emulator; the measured numbers (see module doc)."""
    from geotrain.emulate.launch import LaunchConfig, launch
    from geotrain.emulate.report import barrier_intervals_s

    regions = regions_of_devices(list(range(len(devices))), devices, cluster.region_of)
    with tempfile.TemporaryDirectory(prefix="geotrain-hier-") as tmp:
        spec = {**asdict(row), "regions": [list(r) for r in regions.members], "steps": config.steps,
                "batch": config.batch, "seed": seed, "model": asdict(config.model), "lr": config.lr,
                "out": str(Path(tmp) / "result.json")}
        path = Path(tmp) / "row.json"
        path.write_text(json.dumps(spec))
        launched = launch(cluster, devices, LaunchConfig(("-m", "geotrain.bench.hierarchical_worker", str(path)),
                                                        time_scale=0.0, report_path=Path(tmp) / "report.json",
                                                        timeout_s=config.timeout_s))
        if launched.exit_code != 0:
            raise RuntimeError(f"{row.label} seed {seed}: emulated run failed with exit code {launched.exit_code}")
        result = json.loads(Path(spec["out"]).read_text())
    report = launched.report
    barriers = [o for o in report["ops"] if o["op"] == "barrier" and o["group"] == "0"]
    steps = config.steps
    first_s, last_s = barriers[0]["end_s"], barriers[steps]["end_s"]  # the barriers around the steps
    inter_emulated = sum(t["nbytes"] for t in report["transfers"]
                         if first_s <= t["start_s"] and t["end_s"] <= last_s
                         and cluster.region_of[t["src_device"]] != cluster.region_of[t["dst_device"]])
    return {"label": row.label, "seed": seed, "val_bpc": result["val_bpc"], "final_loss": result["losses"][-1],
            "step_s": statistics.mean(barrier_intervals_s(report)[:steps]),
            "comm_s": _comm_s(report, first_s, last_s) / steps,
            "inter_bytes_per_step": inter_emulated / steps,
            "reducer_inter_bytes_per_step": sum(b[1] for b in result["bytes"]) / steps,
            "reducer_intra_bytes_per_step": sum(b[0] for b in result["bytes"]) / steps}


def run_bench(cluster: Cluster, devices: Sequence[int], config: HierBenchConfig, only: Sequence[str] = (),
              on_run: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every seed x row (seed-major); `only`: keep rows whose label contains one of these strings;
    `on_run(run)` after each run (to keep partial results)."""
    sizes = [p.numel() for p in make_model(config.model, 0).parameters()]
    n_regions = len({int(cluster.region_of[d]) for d in devices})
    rows = [r for r in bench_rows(sizes, len(devices), n_regions) if not only or any(o in r.label for o in only)]
    runs = []
    for seed in config.seeds:
        for row in rows:
            runs.append(run_row(cluster, devices, row, seed, config))
            if on_run is not None:
                on_run(runs[-1])
    return bench_result(cluster.name, devices, config, sum(sizes), runs)


def bench_result(cluster_name: str, devices: Sequence[int], config: HierBenchConfig, n_params: int,
                 runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"cluster": cluster_name, "devices": list(devices), "config": {**asdict(config), "model": asdict(config.model)},
            "n_params": n_params, "runs": list(runs), "rows": summarize(runs)}


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per label: mean and per-seed val bpc, mean seconds and bytes per step."""
    labels = list(dict.fromkeys(run["label"] for run in runs))
    rows = []
    for label in labels:
        mine = [run for run in runs if run["label"] == label]
        rows.append({"label": label, "val_bpc_mean": statistics.mean(r["val_bpc"] for r in mine),
                     "val_bpc": [r["val_bpc"] for r in mine],
                     "step_s": statistics.mean(r["step_s"] for r in mine),
                     "comm_s": statistics.mean(r["comm_s"] for r in mine),
                     "inter_bytes_per_step": statistics.mean(r["inter_bytes_per_step"] for r in mine),
                     "reducer_inter_bytes_per_step": statistics.mean(r["reducer_inter_bytes_per_step"] for r in mine)})
    return rows


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of `run_bench`'s rows."""
    head = (f"{'row':44s} {'val bpc (seeds)':>30s} {'mean':>7s} {'inter MB/step':>13s} {'comm s/step':>11s} "
            f"{'step s':>7s}")
    lines = [f"cluster {result['cluster']}, devices {result['devices']}, {result['n_params']} parameters, "
             f"{result['config']['steps']} steps", head]
    for row in result["rows"]:
        seeds = " ".join(f"{v:.4f}" for v in row["val_bpc"])
        lines.append(f"{row['label']:44s} {seeds:>30s} {row['val_bpc_mean']:7.4f} "
                     f"{row['inter_bytes_per_step'] / 1e6:13.4f} {row['comm_s']:11.3f} {row['step_s']:7.3f}")
    return "\n".join(lines)
