"""`geotrain bench ddp`: torch's DDP hooks, geotrain's codec hooks and OneBitAdam, side by side in 4 gloo processes."""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.cli.arg_types import positive_float, seed

NAME = "ddp"
HELP = ("data-parallel tiny GPT in real gloo processes: torch's DDP hooks vs geotrain codec hooks vs OneBitAdam "
        "(bytes per step, traffic / fp32, validation bpc, seconds)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="training steps per row")
    parser.add_argument("--workers", type=int, default=4, help="processes (ranks)")
    parser.add_argument("--batch", type=int, default=32, help="global batch in sequences (split evenly over ranks)")
    parser.add_argument("--model", choices=("base", "small"), default="base",
                        help="base: the demo GPT (geotrain.models.TINY_2LAYER_GPT); small: 2 layers, d_model 64, context 64 (quick looks)")
    parser.add_argument("--onebit-warmup", type=int, default=None,
                        help="OneBitAdam's full-precision steps (default: 5%% of --steps, at least 1)")
    parser.add_argument("--row", action="append", default=None, metavar="LABEL_PART",
                        help="only rows whose label contains this text (repeatable; the fp32 row always runs)")
    parser.add_argument("--seed", type=seed, default=0, help="model, batch and world seed")
    parser.add_argument("--timeout", type=positive_float, default=3600.0, help="hard limit for the whole run, seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run(args: Any) -> int:
    from geotrain.bench.ddp import MODELS, DDPBenchConfig, DDPBenchError, run_ddp_bench
    from geotrain.cli.output import Output

    if args.steps < 1 or args.workers < 1 or args.batch % args.workers or args.timeout <= 0:
        raise DDPBenchError(f"need --steps >= 1, --workers >= 1, --batch divisible by --workers and --timeout > 0; "
                            f"got {args.steps}, {args.workers}, {args.batch}, {args.timeout}")
    warmup = args.onebit_warmup if args.onebit_warmup is not None else max(1, args.steps // 20)
    if warmup < 1:
        raise DDPBenchError(f"--onebit-warmup must be >= 1, got {warmup}")
    config = DDPBenchConfig(steps=args.steps, workers=args.workers, batch=args.batch, onebit_warmup=warmup,
                            seed=args.seed, model=MODELS[args.model], timeout_s=args.timeout,
                            only=tuple(args.row or ()))
    out = Output(json_mode=args.json)
    bench = run_ddp_bench(config)
    if args.json:
        out.emit_json(bench.to_json())
        return 0
    out.table(f"data-parallel tiny GPT ({args.model}), {config.workers} gloo processes, {config.steps} steps, global batch "
              f"{config.batch}, AdamW lr 3e-3 + clip 1.0 unless stated",
              ["run", "handed B/step", "wire B/step", "traffic / fp32", "val bpc", "seconds"],
              [[row["label"], f"{row['handed_bytes_per_step']:,.0f}", f"{row['wire_bytes_per_step']:,.0f}",
                f"{row['traffic_vs_fp32']:.4f}", "-" if row["val_bpc"] is None else f"{row['val_bpc']:.4f}",
                f"{row['seconds']:.1f}"] for row in bench.rows()])
    mismatched = [row["label"] for row in bench.rows() if row["declared_bytes_match"] is False]
    out.text("handed = bytes one rank passes to collectives (measured at the call); wire = what it sends under "
             "ring all-reduce 2(p-1)/p B, ring all-gather (p-1) B, all-to-all (p-1)/p B; traffic / fp32 uses wire "
             "bytes. geotrain rows: measured bytes " + ("== declared payload bytes for every row."
                                                        if not mismatched else f"DIFFER from declared: {mismatched}"))
    return 0
