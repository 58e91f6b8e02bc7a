"""`geotrain bench pipeline`: a 2-stage pipeline with its cut across a 100 Mbit/s link, fp32 against each
activation codec, and against the same pipeline inside one site (geotrain.bench.pipeline)."""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.cli.arg_types import count, positive_float

NAME = "pipeline"
HELP = ("a 2-stage pipeline with its cut across an emulated 100 Mbit/s link: fp32 activations against each "
        "activation codec (--pp-codec), and the cut inside one site: bytes per step, time to a target loss, final loss")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=count, default=60, help="training steps of every row")
    parser.add_argument("--target", type=positive_float, default=2.6, metavar="NATS",
                        help="target training loss (mean of the last 5 steps) for the time-to-target column")
    parser.add_argument("--codecs", default=None, metavar="CODEC,...",
                        help="the codecs of the 'across' rows (default: none, int8-block, int4-block:block_size=32, "
                             "int4-block, int2-block, sign-block; an item k=v continues the codec before it: "
                             "delta:codec=int2-block,grad=sign-block:block_size=64); the local fp32 row runs "
                             "unless --no-local")
    parser.add_argument("--no-local", action="store_true", help="leave out the local fp32 row")
    parser.add_argument("--windows", default="random", metavar="random|epochs",
                        help="how every row draws training windows (a delta codec needs epochs: train's --windows)")
    parser.add_argument("--epoch-windows", type=int, default=0, metavar="N",
                        help="--windows epochs: the first N aligned windows only (0: all)")
    parser.add_argument("--time-scale", type=positive_float, default=1.0, help="multiply every emulated link time")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def rows_of(text: str | None, local: bool = True) -> tuple[Any, ...]:
    """The bench rows for `--codecs` (None: the default rows), after the local fp32 row unless not `local`; each
    codec checked as --pp-codec checks it."""
    from geotrain.bench.pipeline import DEFAULT_ROWS, PipelineBenchError, PipelineRow
    from geotrain.runtime.sections import CommSection, RuntimeConfigError

    if text is None:
        return DEFAULT_ROWS if local else DEFAULT_ROWS[1:]
    codecs: list[str] = []
    for item in filter(None, (item.strip() for item in text.split(","))):
        if "=" in item.partition(":")[0] and codecs:  # key=value (the value may be a nested spec): the codec before
            codecs[-1] += "," + item
        else:
            codecs.append(item)
    if not codecs:
        raise PipelineBenchError(f"--codecs: give one or more activation codecs, got {text!r}")
    for codec in codecs:
        try:
            CommSection(pp_codec=codec)
        except RuntimeConfigError as exc:
            raise PipelineBenchError(f"--codecs: {exc}") from None
    across = tuple(PipelineRow(f"across, {'fp32' if c == 'none' else c}", c) for c in codecs)
    return ((PipelineRow("local, fp32", "none", across=False),) if local else ()) + across


def run(args: Any) -> int:
    from geotrain.bench.pipeline import PipelineBenchConfig, run_pipeline_bench
    from geotrain.cli.output import Output

    out = Output(json_mode=args.json)
    config = PipelineBenchConfig(steps=args.steps, target=args.target, time_scale=args.time_scale,
                                 rows=rows_of(args.codecs, not args.no_local), windows=args.windows,
                                 epoch_windows=args.epoch_windows)
    with out.progress("bench pipeline", len(config.rows)) as progress:
        bench = run_pipeline_bench(config, progress)
    if args.json:
        out.emit_json(bench.to_json())
        return 0
    rows = [[r.label, f"{r.cut_bytes_per_step:,}", f"{r.bytes_ratio:.1f}x", f"{r.step_s:.3f}",
             "-" if r.time_to_target_s is None else f"{r.time_to_target_s:.1f}", f"{r.train_loss:.4f}",
             f"{r.final_loss:.4f}"] for r in bench.rows]
    out.table(f"bench pipeline: tiny GPT, 2 stages, {config.steps} steps, cut across 100 Mbit/s / 20 ms "
              f"(or inside a site: local); target {config.target} nats",
              ["row", "cut bytes/step", "fewer", "step s", "s to target", "train loss", "val loss"], rows,
              right_align_from=1)
    return 0
