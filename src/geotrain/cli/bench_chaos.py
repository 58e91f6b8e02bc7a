"""`geotrain bench chaos`: goodput of elastic replica groups (torchft) with a site killed, or partitioned,
every T, beside the synchronous runtime restarting from its last checkpoint (geotrain.bench.chaos). --json:
{"rows": [{"label", "goodput", "steps", "global_restarts", "recoveries", "recovery_s", "val_loss", "elections", ...}],
"config"}; the first row is the elastic run without failures. --netlab adds the partition rows on real shaped TCP
(root)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from geotrain.cli.arg_types import count, positive_float, seed

NAME = "chaos"
HELP = ("goodput under killed and partitioned sites: elastic replica groups (torchft) vs a synchronous run restarting "
        "from checkpoints")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from geotrain.bench.chaos import ChaosBenchConfig

    d = ChaosBenchConfig()
    parser.add_argument("--cluster", default=d.cluster, metavar="FILE|PRESET",
                        help="one replica group per device, pipeline S = 1 (default: the WAN bench's wan-4x1)")
    parser.add_argument("--steps", type=count, default=d.steps, help="training steps of every row")
    parser.add_argument("--batch-size", type=count, default=d.batch_size, help="sequences per replica group per step")
    parser.add_argument("--seq-len", type=count, default=d.seq_len, help="tokens per sequence")
    parser.add_argument("--model", default=d.model, metavar="PRESET", help="GPT preset (the WAN bench's tiny)")
    parser.add_argument("--kills", type=count, default=d.kills, help="sites killed (partitioned) in each failing row, every T = a "
                                                                     "quarter of the failure-free training time")
    parser.add_argument("--checkpoint-every", type=count, default=d.checkpoint_every,
                        help="the synchronous baseline's checkpoint cadence (steps)")
    parser.add_argument("--heartbeat-timeout", type=positive_float, default=d.heartbeat_timeout_s,
                        help="elastic rows: seconds without a heartbeat before the lighthouse drops a replica group "
                             "(the survivors' stall per kill)")
    parser.add_argument("--worker-heartbeat-timeout", type=positive_float, default=d.worker_heartbeat_timeout_s,
                        help="restart rows: seconds without a heartbeat before a worker counts as lost")
    parser.add_argument("--sync-every", type=count, default=None, metavar="H",
                        help="DiLoCo: synchronise every H steps (default: gradients every step)")
    parser.add_argument("--netlab", action="store_true",
                        help="two more rows: no failures and the partitions on real shaped TCP "
                             "(train --elastic --netlab; root)")
    parser.add_argument("--seed", type=seed, default=d.seed, help="model seed; also draws the killed sites")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    from geotrain.cli.run_dir_args import add_bench_run_dir

    add_bench_run_dir(parser)


def run(args: Any) -> int:
    from geotrain.bench.chaos import ChaosBenchConfig, run_chaos_bench
    from geotrain.cli.output import Output

    config = ChaosBenchConfig(cluster=args.cluster, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                              model=args.model, seed=args.seed, heartbeat_timeout_s=args.heartbeat_timeout,
                              worker_heartbeat_timeout_s=args.worker_heartbeat_timeout,
                              checkpoint_every=args.checkpoint_every, kills=args.kills, sync_every=args.sync_every,
                              netlab=args.netlab, run_dir=args.run_dir)
    out = Output(json_mode=args.json)
    rows = run_chaos_bench(config, None if args.json else lambda label: out.text(f"running: {label}"))
    if args.json:
        out.emit_json({"rows": [asdict(row) for row in rows], "config": asdict(config)})
        return 0
    out.table(f"bench chaos: {config.model} GPT, {config.steps} steps, {config.batch_size} x {config.seq_len} tokens "
              f"per group", ["row", "goodput", "steps", "global restarts", "recoveries", "recovery s", "elections",
                             "val loss", "train s"],
              [[r.label, f"{r.goodput:.3f}", r.steps, r.global_restarts, r.recoveries,
                " ".join(f"{s:.1f}" for s in r.recovery_s) or "-", r.elections,
                "-" if r.val_loss is None else f"{r.val_loss:.4f}", f"{r.train_s:.1f}"] for r in rows])
    return 0
