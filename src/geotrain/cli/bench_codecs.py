"""`geotrain bench codecs`: encode+decode throughput of every codec beside memcpy; approximate vs exact top-k."""

from __future__ import annotations

import argparse
from typing import Any

NAME = "codecs"
HELP = "codec encode+decode throughput (GB/s of fp32 input) as a ratio to memcpy; approximate vs torch.topk"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", nargs="+", default=["1e6", "1e7"], metavar="N",
                        help="tensor sizes in values (fp32), integers (1e6 is fine)")
    parser.add_argument("--large", action="store_true", help="also 1e8 values (400 MB input, about 2 GB of RAM)")
    parser.add_argument("--codec", action="append", default=None, metavar="LABEL",
                        help="only this row (repeatable): a codec name or 'topk-sort' (topk with selection=sort, i.e. torch.topk)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads for the whole run (1: steadiest ratios on a shared machine)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per row; the best counts")
    parser.add_argument("--fraction", type=float, default=0.01, help="top-k fraction of the selection table")
    parser.add_argument("--seed", type=int, default=0, help="seed of the input tensors and of the top-k sample")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: Any) -> int:
    from geotrain.bench.codecs import (
        DEFAULT_VARIANTS,
        LARGE_SIZE,
        CodecBenchConfig,
        CodecBenchError,
        parse_size,
        run_codec_bench,
    )
    from geotrain.cli.output import Output

    sizes = [parse_size(str(size)) for size in args.sizes] + ([LARGE_SIZE] if args.large else [])
    variants = DEFAULT_VARIANTS
    if args.codec:
        known = [variant.label for variant in DEFAULT_VARIANTS]
        unknown = [label for label in args.codec if label not in known]
        if unknown:
            raise CodecBenchError(f"unknown --codec {', '.join(map(repr, unknown))} (known: {', '.join(known)})")
        variants = tuple(variant for variant in DEFAULT_VARIANTS if variant.label in args.codec)
    config = CodecBenchConfig(sizes=tuple(dict.fromkeys(sizes)), variants=variants, threads=args.threads,
                              repeats=args.repeats, topk_fraction=args.fraction, seed=args.seed)
    out = Output(json_mode=args.json)
    with out.progress("bench codecs", 1) as progress:
        bench = run_codec_bench(config, progress)
    if args.json:
        out.emit_json(bench.to_json())
        return 0
    for n in config.sizes:
        rows = [row for row in bench.rows if row["n"] == n]
        out.table(f"encode + decode of {n:.0e} fp32 values ({bench.threads} torch thread(s), best of {config.repeats})",
                  ["codec", "B/value", "rel.err", "enc ms", "dec ms", "GB/s", "memcpy", "x memcpy", "x copy_"],
                  [[row["label"], f"{row['bytes_per_value']:.4f}", f"{row['relative_error']:.1e}",
                    f"{1e3 * row['encode_s']:.1f}", f"{1e3 * row['decode_s']:.1f}", f"{row['gbps']:.2f}",
                    f"{row['memcpy_gbps']:.2f}", f"{row['ratio_to_memcpy']:.2f}", f"{row['ratio_to_copy_into']:.2f}"]
                   for row in rows])
    out.table(f"top-{100 * config.topk_fraction:g}% index selection: sampled threshold vs torch.topk",
              ["values", "k", "topk ms", "approx ms", "speed-up", "energy", "same set"],
              [[f"{row['n']:.0e}", f"{row['k']:,}", f"{1e3 * row['torch_topk_s']:.1f}", f"{1e3 * row['approx_s']:.1f}",
                f"{row['speedup']:.1f}x", f"{100 * row['energy_kept']:.2f}%", "yes" if row["same_set"] else "no"]
               for row in bench.topk])
    if bench.targets:
        out.table("targets (issue 4)", ["target", "measured", "met"],
                  [[check["target"], f"{check['value']:.3g}", "yes" if check["met"] else "NO"] for check in bench.targets])
    out.text("GB/s = 4 bytes x values / (encode s + decode s); memcpy = tensor.clone() of the same tensor, "
             "timed in the same loop; x copy_ = ratio to a copy into a preallocated tensor (no allocation).")
    return 0
