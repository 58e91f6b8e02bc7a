"""`geotrain train`: run a plan as S x R worker processes over emulated links, and compare the cost
model's prediction with the measured communication.

With --json, stdout is ONE JSON object: {"plan", "stages", "replicas", "assignment", "losses",
"summary": {"iteration_s", "compute_s", "comm_measured_s", "comm_predicted_s", "error_pct", ...},
"prediction", "bytes", "iterations": [...], "config", "wall_s"}; seconds are wall seconds of the
emulated run (already multiplied by --time-scale).

Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and TORCHELASTIC_RUN_ID set), this process is
one worker: nothing is launched, and rank 0 prints the results (see docs/runtime.md for several
machines). The env:// variables without torchrun's marker are leftovers: noted on stderr and ignored.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from geotrain.cli.output import Output


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train", help="run a plan: pipeline x data-parallel training of the tiny GPT over emulated links",
        description="Launch one worker process per (stage, replica) slot of a plan (gloo on localhost), train "
                    "the tiny GPT with a GPipe/1F1B schedule, every transfer slowed to the cluster's emulated "
                    "link speed, and report measured vs predicted communication per iteration.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_train_arguments(parser)
    parser.set_defaults(handler=run)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True, metavar="FILE|PRESET", help="cluster preset or YAML/JSON file")
    parser.add_argument("--plan", required=True, metavar="PLAN.json", help="plan file (as `geotrain plan --json` writes)")
    parser.add_argument("--model", default="tiny", help="model preset: tiny (4 blocks, d_model 128, context 96), tiny-2layer")
    parser.add_argument("--steps", type=int, default=20, help="training iterations (the learning-rate schedule spans them)")
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches per iteration")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per replica per iteration")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (warm-up + cosine)")
    parser.add_argument("--schedule", default="gpipe", choices=["gpipe", "1f1b"], help="pipeline schedule")
    parser.add_argument("--dp-codec", default="none", metavar="CODEC[:k=v,...]",
                        help="gradient codec of the data-parallel exchange, e.g. fp16, topk:fraction=0.01")
    parser.add_argument("--dp-hierarchical", action="store_true",
                        help="exchange DP gradients hierarchically: full precision inside each cluster region, "
                             "--dp-codec (with error feedback) only between regions, sharded over the region's "
                             "members (docs/hierarchical.md)")
    parser.add_argument("--pp-codec", default="none", help="activation codec: none, fp16, bf16, int8-block")
    parser.add_argument("--no-error-feedback", dest="error_feedback", action="store_false",
                        help="send DP gradients without error feedback")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply every emulated link time by this (0: no emulation)")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation seed")
    parser.add_argument("--data-seed", type=int, default=0, help="world text and batch seed")
    parser.add_argument("--checkpoint-dir", metavar="DIR", help="write sharded checkpoints here")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every K steps (0: at the end only)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint-dir")
    parser.add_argument("--overwrite", action="store_true",
                        help="start a new run in a --checkpoint-dir that holds another run's checkpoints, "
                             "deleting them (its latest pointer and step-* directories)")
    parser.add_argument("--stop-after", type=int, metavar="K", help="stop this invocation after K steps (planned interruption)")
    parser.add_argument("--heartbeat-timeout", type=float, default=10.0,
                        help="seconds without a heartbeat after which a worker counts as lost")
    parser.add_argument("--comm-timeout", type=float, default=120.0, help="gloo collective/p2p timeout in seconds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of tables")


def config_from_args(args: Any) -> Any:
    """The RuntimeConfig the arguments describe (cluster and plan loaded and checked)."""
    from geotrain.cluster import load_cluster
    from geotrain.plan import load_plan
    from geotrain.runtime import MODEL_PRESETS, RuntimeConfig, RuntimeConfigError

    cluster = load_cluster(args.cluster)
    plan = load_plan(args.plan)
    assignment = plan.check_fits(cluster.n_devices, args.plan)
    if args.model not in MODEL_PRESETS:
        raise RuntimeConfigError(f"unknown model {args.model!r} (known: {', '.join(MODEL_PRESETS)})")
    return RuntimeConfig(
        cluster=cluster, assignment=assignment, model=MODEL_PRESETS[args.model], model_name=args.model,
        steps=args.steps, microbatches=args.microbatches, batch_size=args.batch_size, lr=args.lr,
        schedule=args.schedule, dp_codec=args.dp_codec, pp_codec=args.pp_codec, error_feedback=args.error_feedback,
        dp_hierarchical=args.dp_hierarchical,
        time_scale=args.time_scale, seed=args.seed, data_seed=args.data_seed, threads=args.threads,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, resume=args.resume,
        overwrite=args.overwrite,
        stop_after=args.stop_after, heartbeat_timeout_s=args.heartbeat_timeout, comm_timeout_s=args.comm_timeout,
        plan_name=str(plan.fields.get("method", Path(args.plan).stem)))


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"
"""Set by torchrun (torch.distributed.run) in every worker it starts; another env:// launcher sets it too."""


def under_torchrun() -> bool:
    """True when this process was started by torchrun as one worker: the env:// variables AND
    torchrun's own marker are set. The variables alone (left over in a shell) do not count."""
    return TORCHRUN_MARKER in os.environ and all(key in os.environ for key in TORCHRUN_VARIABLES)


def stray_torchrun_variables() -> list[str]:
    """env:// variables set in a process that torchrun did not start (ignored: we launch locally)."""
    if under_torchrun():
        return []
    return [key for key in TORCHRUN_VARIABLES if key in os.environ]


def iteration_table(out: Output, report: Any) -> None:
    rows = [[row.step, f"{row.loss:.4f}", f"{row.iteration_s:.3f}", f"{row.compute_s:.3f}",
             f"{row.comm_predicted_s:.3f}", f"{row.comm_measured_s:.3f}",
             f"{row.dp_measured_s:.3f}", f"{row.pp_measured_s:.3f}", f"{row.error_pct:+.1f}"] for row in report.rows]
    out.table(f"iterations of plan {report.plan} (seconds; comm = dp + pp)",
              ["step", "loss", "iteration", "compute", "comm predicted", "comm measured", "dp meas.", "pp meas.",
               "error %"], rows)


def summary_rows(reports: list[Any]) -> list[list[Any]]:
    rows = []
    for report in reports:
        s = report.summary()
        rows.append([report.plan, f"{s['iteration_s']:.3f}", f"{s['comm_predicted_s']:.3f}",
                     f"{s['comm_measured_s']:.3f}", f"{s['error_pct']:+.1f}",
                     f"{s['first_loss']:.4f} -> {s['final_loss']:.4f}"])
    return rows


SUMMARY_COLUMNS = ["plan", "iteration s", "predicted comm s", "measured comm s", "error %", "loss"]


def run(args: Any) -> int:
    from geotrain.runtime import build_report, launch, run_worker
    from geotrain.runtime.launcher import check_before_launch

    config = config_from_args(args)
    out = Output(json_mode=args.json)
    stray = stray_torchrun_variables()
    if stray:
        print(f"geotrain: note: ignoring {', '.join(stray)} in the environment: this process was not started "
              f"by torchrun ({TORCHRUN_MARKER} is unset), so it launches its own workers", file=sys.stderr)
    if under_torchrun():
        check_before_launch(config, clear=os.environ["RANK"] == "0")
        records = run_worker(config)
        if records is None:
            return 0
        report, wall_s = build_report(config, records), None
    else:
        with out.progress("training", config.steps) as progress:
            result = launch(config, progress=progress)
        report, wall_s = result.report, result.wall_s
    if args.json:
        out.emit_json({**report.to_json(), "wall_s": wall_s})
        return 0
    iteration_table(out, report)
    out.table("summary (means over iterations after the first)", SUMMARY_COLUMNS, summary_rows([report]))
    out.text(f"payload bytes per iteration: DP gradient per stage {list(report.dp_bytes_per_stage)}, "
             f"activations per replica per cut {report.pp_bytes_per_cut} (each way)")
    return 0
