"""`geotrain bench hetero`: time to a target validation loss on 4 sites whose GPUs differ 4.8x in speed, per way of
sharing the work (geotrain.bench.hetero). --json: {"rows": [{"kind", "label", "time_to_target_s", "val_loss",
"site_compute_fraction": {site: fraction}, "inter_region_bytes", "predicted_step_s", "measured_step_s",
"predicted_site_compute_fraction": {site: fraction}, "recipe", "elapsed_s", "inner_steps": {site: steps},
"curve"}...], "target", "cluster", "gpus", "skipped"}; the last row is the limit. predicted_*: the planner's, from
the limit row's measured compute per step (null where it prices nothing: async, the limit); measured_step_s: elapsed
emulated seconds over the step budget; "recipe": the recipe row's plan ("wan_recipe" of `geotrain plan`)."""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.cli.arg_types import output_file, seed

NAME = "hetero"
HELP = ("time to a target validation loss on 4 WAN sites with a 4.8x GPU speed spread: DDP, DiLoCo with equal and "
        "adaptive local steps, the planner's recipe (predicted vs measured), and the limit (free links, work "
        "balanced by speed)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from geotrain.bench.hetero import HETERO_CLUSTER_NAME, KINDS, hetero_config

    d = hetero_config()
    parser.add_argument("--cluster", default=HETERO_CLUSTER_NAME, metavar="FILE|PRESET",
                        help="the emulated cluster (one device per site): hetero-4x1, a file or a preset")
    parser.add_argument("--steps", type=int, default=d.steps, help="step budget of every row (adaptive rows: the "
                        "same samples, in ceil(steps / H) outer periods)")
    parser.add_argument("--target", type=float, default=d.target, help="target validation loss (nats per character)")
    parser.add_argument("--global-batch", type=int, default=d.global_batch, help="sequences per step over all replicas")
    parser.add_argument("--lr", type=float, default=d.lr, help="peak AdamW learning rate")
    parser.add_argument("--time-scale", type=float, default=d.time_scale,
                        help="wall seconds slept per emulated link second (emulated times do not depend on it)")
    parser.add_argument("--rows", default=None, metavar="KIND,...",
                        help=f"run only these kinds ({', '.join(KINDS)}; the limit always)")
    parser.add_argument("--seed", type=seed, default=d.seed, help="model seed")
    parser.add_argument("--plot", default=None, type=output_file, metavar="FILE.png",
                        help="also plot validation loss vs emulated time")
    from geotrain.cli.run_dir_args import add_bench_run_dir

    add_bench_run_dir(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: Any) -> int:
    from geotrain.bench.hetero import hetero_config, run_hetero_bench, with_rows
    from geotrain.cli.output import Output, format_or

    config = hetero_config(cluster=args.cluster, steps=args.steps, target=args.target, global_batch=args.global_batch,
                           lr=args.lr, time_scale=args.time_scale, seed=args.seed, run_dir=args.run_dir)
    rows = with_rows(args.rows)
    out = Output(json_mode=args.json)
    with out.progress("bench hetero", config.steps) as progress:
        bench = run_hetero_bench(config, rows, lambda label, done, total: progress(done, total))
    doc = bench.to_json()
    if args.plot:
        from geotrain.plots.wan import plot_loss_vs_time

        plot_loss_vs_time({r["label"]: (r["curve"]["time_s"], r["curve"]["val_loss"]) for r in doc["rows"]},
                          args.plot, doc["target"],
                          f"bench hetero on {doc['cluster']}: {config.steps} steps' samples each")
    if args.json:
        out.emit_json(doc)
        return 0
    sites = list(doc["gpus"])
    gpus = ", ".join(f"{site} {gpu}" for site, gpu in doc["gpus"].items())
    out.table(f"bench hetero: {config.model} GPT on {doc['cluster']} ({gpus}), "
              f"{config.steps} steps' samples each, target validation loss {config.target:g} (emulated seconds)",
              ["kind", "row", "time to target", "elapsed", "val loss", "step predicted / measured (s)",
               "compute fraction (" + ", ".join(sites) + "), predicted / measured", "inner steps", "inter-region MB"],
              [[r["kind"], r["label"], format_or(r["time_to_target_s"], ".1f"), f"{r['elapsed_s']:.1f}",
                f"{r['val_loss']:.4f}", f"{format_or(r['predicted_step_s'], '.3f')} / {r['measured_step_s']:.3f}",
                (" ".join(f"{r['predicted_site_compute_fraction'][s]:.2f}" for s in sites) + " / "
                 if r["predicted_site_compute_fraction"] else "- / ")
                + " ".join(f"{r['site_compute_fraction'][s]:.2f}" for s in sites),
                " ".join(str(r["inner_steps"][s]) for s in sites), f"{r['inter_region_bytes'] / 1e6:.1f}"]
               for r in doc["rows"]], right_align_from=2)
    recipe = next((r["recipe"] for r in doc["rows"] if r["recipe"]), None)
    if recipe is not None:
        out.text(f"the planner's recipe: H {recipe['sync_every']}, {recipe['local_steps']} local steps "
                 f"({' / '.join(map(str, recipe['replica_steps']))} per period at first), P {recipe['fragments']}, "
                 f"tau {recipe['delay']}, outer codec {recipe['codec']} (equal / adaptive local steps predicted "
                 + " / ".join(f"{v:.3f}" for v in recipe["local_steps_step_s"].values()) + " s per step)")
        row = next(r for r in doc["rows"] if r["recipe"])
        out.text(f"its predicted time to target: {format_or(row['predicted_time_to_target_s'], '.2f', '-')} s "
                 f"(measured {format_or(row['time_to_target_s'], '.2f')} s; cost.convergence, the limit row's steps to "
                 f"the target {format_or((recipe.get('convergence') or {}).get('target_steps'), 'g', '-')})")
    for skipped in doc["skipped"]:
        out.text(f"skipped {skipped['kind']}: {skipped['reason']}")
    if args.plot:
        out.text(f"plot written to {args.plot}")
    return 0
