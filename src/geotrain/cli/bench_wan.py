"""`geotrain bench wan`: time to a target validation loss on an emulated slow WAN, per placement and
codec row (see geotrain.bench.wan). --json: {"rows": [{"label", "time_to_target_s", "speedup",
"inter_region_bytes", "val_loss", "limit_fraction", "compute_fraction", "peak_inter_region_gbps" (1 s windows),
"peak_inter_region_gbps_by_window" ({"0.01": Gbit/s, ..., "1": Gbit/s}), ...}],
"target", ...}; the first row is the fp32 DDP baseline, the last the limit row (its training with every
link free)."""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.cli.arg_types import output_file, seed

NAME = "wan"
HELP = "time to a target validation loss of a small GPT on an emulated ~100 Mbit/s, 50-150 ms geo cluster"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from geotrain.bench.wan import WanBenchConfig
    from geotrain.bench.wan_rows import WAN_CLUSTER_NAME

    d = WanBenchConfig()
    parser.add_argument("--cluster", default=WAN_CLUSTER_NAME, metavar="FILE|PRESET", help="the emulated cluster: wan-4x1 (4 sites x 1 device), wan-4x2 (4 sites x 2 devices), a file or a preset")
    parser.add_argument("--steps", type=int, default=d.steps, help="step budget of every row")
    parser.add_argument("--eval-every", type=int, default=d.eval_every, help="validation loss every K steps")
    parser.add_argument("--target", type=float, default=d.target, help="target validation loss (nats per character)")
    parser.add_argument("--global-batch", type=int, default=d.global_batch, help="sequences per step over all replicas")
    parser.add_argument("--lr", type=float, default=d.lr, help="peak AdamW learning rate")
    parser.add_argument("--codec-policy", default=d.codec_policy, help="policy of the planner-codecs row")
    parser.add_argument("--time-scale", type=float, default=d.time_scale,
                        help="wall seconds slept per emulated link second (emulated times do not depend on it)")
    parser.add_argument("--compute-clock", default=d.compute_clock, choices=("cpu", "wall"),
                        help="count compute in each rank's CPU seconds (as if on its own core) or in wall seconds")
    parser.add_argument("--rows", default=None, metavar="I,J,...",
                        help="run only these rows (0 = the baseline and the last, the limit row, always run)")
    parser.add_argument("--seed", type=seed, default=d.seed, help="model seed")
    parser.add_argument("--model", default=d.model, metavar="PRESET",
                        help="GPT preset every row trains: tiny (817k parameters), small (3.2M, bandwidth-bound)")
    parser.add_argument("--plot", default=None, type=output_file, metavar="FILE.png", help="also plot validation loss vs emulated time")
    from geotrain.cli.run_dir_args import add_bench_run_dir

    add_bench_run_dir(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: Any) -> int:
    from geotrain.bench.wan import DEFAULT_ROWS, LIMIT_ROW, WanBenchConfig, WanBenchError, run_wan_bench
    from geotrain.cli.output import Output, format_or

    rows = DEFAULT_ROWS
    if args.rows:
        try:
            picked = sorted({0, LIMIT_ROW, *(int(i) for i in args.rows.split(","))})
            if picked[0] < 0:
                raise IndexError(picked[0])
            rows = tuple(DEFAULT_ROWS[i] for i in picked)
        except (ValueError, IndexError):
            raise WanBenchError(f"--rows: comma-separated row numbers in 0..{len(DEFAULT_ROWS) - 1}, "
                                f"got {args.rows!r}") from None
    config = WanBenchConfig(cluster=args.cluster, steps=args.steps, eval_every=args.eval_every, target=args.target,
                            global_batch=args.global_batch, lr=args.lr, codec_policy=args.codec_policy,
                            time_scale=args.time_scale, seed=args.seed, compute_clock=args.compute_clock, model=args.model,
                            rows=rows, run_dir=args.run_dir)
    out = Output(json_mode=args.json)
    with out.progress("bench wan", config.steps) as progress:
        bench = run_wan_bench(config, lambda label, done, total: progress(done, total))
    doc = bench.to_json()
    if args.plot:
        from geotrain.plots.wan import plot_loss_vs_time

        plot_loss_vs_time({r["label"]: (r["curve"]["time_s"], r["curve"]["val_loss"]) for r in doc["rows"]},
                          args.plot, doc["target"], f"bench wan on {doc['cluster']}: {config.steps} steps each")
    if args.json:
        out.emit_json(doc)
        return 0
    out.table(f"bench wan: {config.model} GPT on {doc['cluster']}, {config.steps} steps each, target validation loss "
              f"{config.target:g} (emulated seconds)",
              ["row", "layout", "codecs (dp / pp)", "s per step", "time to target", "speed-up", "x limit",
               "compute", "peak Gbit/s (1 s / 0.1 s)", "inter-region MB",
               f"val loss @{config.steps}", "vs fp32 @ same steps"],
              [[r["label"], f"{r['stages']}x{r['replicas']}", f"{','.join(r['codecs']['dp'])} / {','.join(r['codecs']['pp']) or '-'}",
                f"{r['step_time_s']:.3f}", format_or(r["time_to_target_s"], ".1f"), format_or(r["speedup"], ".2f", "-"),
                format_or(r["limit_fraction"], ".2f", "-"), f"{r['compute_fraction']:.2f}",
                f"{r['peak_inter_region_gbps']:.3f} / {r['peak_inter_region_gbps_by_window']['0.1']:.3f}",
                f"{r['inter_region_bytes'] / 1e6:.1f}", f"{r['val_loss']:.4f}", f"{r['quality_cost']:+.4f}"]
               for r in doc["rows"]], right_align_from=3)
    out.table("planner: predicted communication per iteration (s, yuan) per layout",
              ["layout", "uncompressed", "with codecs", "dp codecs", "pp codecs"],
              [[name, f"{v['uncompressed_s']:.3f}", f"{v['with_codecs_s']:.3f}", ",".join(v["dp_codecs"]),
                ",".join(v["pp_codecs"]) or "-"] for name, v in doc["planned_layouts"].items()], right_align_from=1)
    for r in doc["rows"]:
        if r["recipe"]:
            predicted = format_or(r["predicted_time_to_target_s"], ".2f", "-")
            out.text(f"{r['label']}: predicted time to target {predicted} s, "
                     f"measured {format_or(r['time_to_target_s'], '.2f')} s (cost.convergence)")
    for skipped in doc["skipped"]:
        out.text(f"skipped {skipped['label']}: {skipped['reason']}")
    if args.plot:
        out.text(f"plot written to {args.plot}")
    return 0
