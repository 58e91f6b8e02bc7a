"""Schedule model vs measured iteration time of `geotrain bench runtime --json` runs.
Compute per op is calibrated from the run's measured compute seconds (compute_s / 3M per forward);
links, bytes, schedule order and all-reduce are the model's."""
import json, sys
import numpy as np
from geotrain.runtime.bench import RuntimeBenchConfig, bench_cluster
from geotrain.cost.schedule import schedule_seconds

print("| run (S x R, M, inter link) | plan | measured iteration s | compute s | yuan comm + compute s (err) | schedule s (err) |")
print("|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    d = json.load(open(path))
    cfg = RuntimeBenchConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d["config"].items()})
    cluster = bench_cluster(cfg)
    M = cfg.microbatches
    for p in d["plans"]:
        s = p["summary"]
        a = np.array(p["assignment"])
        fwd = np.full(cluster.n_devices, s["compute_s"] / (3 * M))
        msg = p["bytes"]["pp_per_cut"] / M
        ends, dp = schedule_seconds(cluster, a, fwd, msg, np.array(p["bytes"]["dp_per_stage"], float), M, "gpipe")
        pred = float((ends + dp).max())
        naive = s["comm_predicted_s"] + s["compute_s"]
        meas = s["iteration_s"]
        print(f"| {cfg.stages}x{cfg.replicas}, M={M}, {cfg.inter_gbps*1e3:g} Mbit/s {cfg.inter_ms:g} ms | {p['label']} | {meas:.3f} | {s['compute_s']:.3f} | "
              f"{naive:.3f} ({100*(naive-meas)/meas:+.1f}%) | {pred:.3f} ({100*(pred-meas)/meas:+.1f}%) |")
