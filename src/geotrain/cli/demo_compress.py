"""`geotrain demo compress`: the seed's demo 2 (data-parallel training with compressed gradients) as tables."""

from __future__ import annotations

import argparse
import os
from typing import Any

from geotrain.cli.arg_types import output_file, seed

NAME = "compress"
HELP = ("seed demo 2: a tiny GPT trained by p simulated workers whose gradients are compressed "
        "(fp16, int8, top-1%, sign; with/without error feedback): traffic vs validation bits per character")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--workers", type=int, default=4, help="simulated data-parallel workers (divides the batch of 32)")
    parser.add_argument("--seed", type=seed, default=0, help="model initialisation seed (batches use seed + 1)")
    parser.add_argument("--layers", type=int, default=None, help="transformer blocks (default: the demo model's)")
    parser.add_argument("--d-model", type=int, default=None, help="model width (default: the demo model's)")
    parser.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)),
                        help="runs trained at once, each in its own process (results do not depend on it)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--plot", default=None, type=output_file, metavar="FILE", help="write a PNG of bpc vs traffic to FILE")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: Any) -> int:
    from dataclasses import replace

    import torch

    from geotrain.cli.output import Output
    from geotrain.data import world_tokens
    from geotrain.demos.compress import CompressDemoConfig, compress_observations, run_compress_demo
    from geotrain.models import TINY_2LAYER_GPT
    from geotrain.sim import TrainingConfigError

    if args.jobs < 1 or args.threads < 1:
        raise TrainingConfigError(f"--jobs and --threads must be >= 1, got {args.jobs} and {args.threads}")
    model = replace(TINY_2LAYER_GPT, n_layer=args.layers or TINY_2LAYER_GPT.n_layer,
                    d_model=args.d_model or TINY_2LAYER_GPT.d_model)
    config = CompressDemoConfig(steps=args.steps, workers=args.workers, seed=args.seed, model=model)
    config.train_config(config.tables[0], config.tables[0].runs[0])  # validate options before any work
    out = Output(json_mode=args.json)
    data = world_tokens(config.world_seed)
    if args.jobs == 1:
        torch.set_num_threads(args.threads)
    demo = run_compress_demo(config, data, out.progress, processes=args.jobs, threads_per_process=args.threads)
    if args.plot:
        _plot(demo, args.plot)
    if args.json:
        out.emit_json({**demo.to_json(), "plot": args.plot, "jobs": args.jobs, "threads": args.threads})
        return 0
    out.text(f"Demo 2: {config.workers} simulated workers (data parallel, {config.batch // config.workers} of the "
             f"{config.batch} sequences each), {config.steps} steps from random initialisation; tiny GPT of "
             f"{demo.n_params:,} parameters ({model.n_layer} layers, d_model {model.d_model}, context {model.context}); "
             f"world text: {data.train.numel():,} train / {data.val.numel():,} validation characters.")
    out.text("Bytes per value are measured from the real payloads each worker sends (fp32 = 4).")
    for table in config.tables:
        rows = [[row.label, f"{row.bytes_per_value:.4f}", f"{row.traffic_vs_fp32:.4f}",
                 f"{row.val_bpc:.4f}" + ("" if row.diverged_at_step is None else f" (diverged at step {row.diverged_at_step})"),
                 f"{row.seconds:.1f}"] for row in demo.table_rows(table.key)]
        out.table(table.title, ["compression", "bytes/value", "traffic / fp32", "val bits/char", "run s"], rows)
    out.text("\nObservations (from this run's numbers):")
    for i, obs in enumerate(compress_observations(demo), 1):
        out.text(f" {i}. ({'holds' if obs.holds else 'does not hold'}) {obs.text}")
    out.text(f"\n{len(demo.rows)} runs in {demo.seconds:.0f} s ({args.jobs} at a time, {args.threads} torch thread(s) each)")
    if args.plot:
        out.text(f"plot written to {args.plot}")
    return 0


def _plot(demo: Any, path: str) -> None:
    from geotrain.plots import plot_bpc_vs_traffic

    series = {table.title: [(row.key, row.traffic_vs_fp32, row.val_bpc) for row in demo.table_rows(table.key)]
              for table in demo.config.tables}
    plot_bpc_vs_traffic(series, path, f"demo 2: {demo.config.workers} workers, {demo.config.steps} steps, "
                                      f"{demo.n_params:,} parameters")
