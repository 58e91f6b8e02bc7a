"""`geotrain train`: run a plan as S x R worker processes over emulated links, and compare the cost
model's prediction with the measured communication.

With --json, stdout is ONE JSON object: {"plan", "stages", "replicas", "assignment", "losses",
"summary": {"iteration_s", "compute_s", "comm_measured_s", "comm_predicted_s", "error_pct", ...},
"prediction", "bytes", "iterations": [...], "validation": [{"step", "loss"}...], "config", "wall_s"};
seconds are wall seconds of the emulated run (already multiplied by --time-scale).

Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and TORCHELASTIC_RUN_ID set), this process is
one worker: nothing is launched, and rank 0 prints the results (see docs/runtime.md for several
machines). The env:// variables without torchrun's marker are leftovers: noted on stderr and ignored.

Several hosts (devices name their `host` in the cluster file; see geotrain.runtime.hosts): on each host
`--node NAME --rdzv HOST:PORT` starts exactly that host's ranks (rank 0's host hosts the store at
PORT and prints the results; the others print a line, or {"node", "ranks", "wall_s"} with --json);
`--print-torchrun` prints one torchrun command per host instead of training.
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
        "train", help="run a plan: pipeline x data-parallel training of your model on your data over emulated links",
        description="Launch one worker process per (stage, replica) slot of a plan (gloo on localhost), train "
                    "the model (--model) on the data (--data) with a torch.distributed.pipelining schedule, every "
                    "transfer slowed to the cluster's emulated link speed, and report measured vs predicted "
                    "communication per iteration and the validation loss.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_train_arguments(parser)
    parser.set_defaults(handler=run)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True, metavar="FILE|PRESET", help="cluster preset or YAML/JSON file")
    parser.add_argument("--plan", required=True, metavar="PLAN.json", help="plan file (as `geotrain plan --json` writes)")
    parser.add_argument("--model", default="tiny", metavar="SPEC",
                        help="tiny (4 blocks, d_model 128, context 96), tiny-2layer, hf:PRESET|config.json|DIR "
                             "(gpt2-tiny, llama-tiny, qwen2-tiny, mistral-tiny), path/to/file.py:function or "
                             "package.module:function returning the layer list")
    parser.add_argument("--data", metavar="FILE|DIR",
                        help="text / jsonl / token file (or a directory of them); default: the synthetic world")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="fraction of --data held out for validation")
    parser.add_argument("--eval-every", type=int, default=0, metavar="N",
                        help="validation loss every N steps and at the end (0: never)")
    parser.add_argument("--eval-windows", type=int, default=32, help="validation windows per evaluation (at most)")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default: a tiny preset's context, else 128)")
    parser.add_argument("--split", default="layers", choices=["layers", "params", "time"],
                        help="cut the layer list into stages by equal layer counts, parameter counts or measured time")
    parser.add_argument("--split-by-speed", action="store_true",
                        help="weight the --split by each stage's speed (its slowest replica's GPU peak FLOP/s from "
                             "the cluster's gpu types): faster stages take more layers; equal GPUs: the plain split. "
                             "A plan made with `geotrain plan --uneven-split` brings its own cut (used when it fits "
                             "the model, else cut by speed)")
    parser.add_argument("--emulate-gpu-speed", action="store_true",
                        help="emulated compute runs at each device's GPU speed: measured compute x (the cluster's "
                             "fastest GPU's peak FLOP/s / the device's); the fastest computes at this machine's speed "
                             "(needs --time-scale > 0)")
    parser.add_argument("--virtual-stages", type=int, metavar="V",
                        help="stages per rank for interleaved-1f1b / looped-bfs (default 2)")
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"],
                        help="cpu (gloo, emulated links) or cuda (NCCL; needs --time-scale 0); auto: cuda if present")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast")
    parser.add_argument("--steps", type=int, default=20, help="training iterations (the learning-rate schedule spans them)")
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches per iteration")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per replica per iteration")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (warm-up + cosine)")
    parser.add_argument("--schedule", default="gpipe", choices=["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs"],
                        help="torch.distributed.pipelining schedule")
    parser.add_argument("--dp-codec", default=None, metavar="CODEC[:k=v,...]",
                        help="gradient codec of the data-parallel exchange, e.g. fp16, topk:fraction=0.01 "
                             "(default: the plan's per-stage choice, else none)")
    parser.add_argument("--pp-codec", default=None,
                        help="activation dtype on the wire: none (fp32), fp16, bf16 (default: the plan's per-cut "
                             "choice, else none)")
    parser.add_argument("--dp-hierarchical", action="store_true",
                        help="exchange DP gradients hierarchically: full precision inside each cluster region, "
                             "--dp-codec (with error feedback) only between regions, sharded over the region's "
                             "members (docs/hierarchical.md)")
    parser.add_argument("--no-error-feedback", dest="error_feedback", action="store_false",
                        help="send DP gradients without error feedback")
    parser.add_argument("--optimizer", default="adamw", choices=["adamw", "onebit-adam"],
                        help="adamw (after the --dp-codec exchange) or onebit-adam (1-bit Adam: averages over the "
                             "stage's DP group itself, fp32 during its warm-up, 1-bit momenta after; needs --dp-codec none)")
    parser.add_argument("--onebit-warmup-steps", type=int, default=5,
                        help="onebit-adam: full-precision AdamW steps before the variance freezes")
    parser.add_argument("--sync-every", type=int, default=None, metavar="H",
                        help="local SGD / DiLoCo: each replica steps AdamW on its own gradients and every H steps "
                             "the DP exchange (--dp-codec, --dp-hierarchical) averages the parameter deltas, applied "
                             "by an outer Nesterov SGD (default: average gradients every step)")
    parser.add_argument("--outer-lr", type=float, default=0.7, help="--sync-every: outer learning rate (DiLoCo: 0.7; "
                        "1 with --outer-momentum 0 = parameter averaging)")
    parser.add_argument("--outer-momentum", type=float, default=0.9, help="--sync-every: outer Nesterov momentum")
    parser.add_argument("--clip-grad-norm", type=float, default=None, metavar="X",
                        help="clip the gradient of the whole model (all stages, after DP averaging) to global L2 norm X")
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
    parser.add_argument("--rdzv", metavar="HOST:PORT",
                        help="several hosts: the rendezvous store, on the host of rank 0 (HOST: its address)")
    parser.add_argument("--node", metavar="NAME",
                        help="several hosts: run only the ranks whose devices have this `host` in the cluster file")
    parser.add_argument("--print-torchrun", action="store_true",
                        help="print one torchrun command per host of the cluster file (rendezvous: --rdzv, "
                             "default <rank 0's host>:29500) and exit")


def config_from_args(args: Any) -> Any:
    """The RuntimeConfig the arguments describe (cluster and plan loaded and checked)."""
    from geotrain.cluster import load_cluster
    from geotrain.plan import load_plan
    from geotrain.runtime import MODEL_PRESETS, RuntimeConfig, RuntimeConfigError
    from geotrain.runtime.config import plan_codec_fields

    cluster = load_cluster(args.cluster)
    plan = load_plan(args.plan)
    assignment = plan.check_fits(cluster.n_devices, args.plan)
    preset = MODEL_PRESETS.get(args.model)
    if preset is None and args.model.rpartition(":")[1] == "" and not args.model.startswith("hf:"):
        raise RuntimeConfigError(f"--model {args.model!r}: not a preset ({', '.join(MODEL_PRESETS)}), hf:SPEC, "
                                 "file.py:function or package.module:function")
    extra = {} if preset is None else {"model": preset}
    return RuntimeConfig(
        cluster=cluster, assignment=assignment, model_name=args.model, **extra,
        data=args.data, val_fraction=args.val_fraction, eval_every=args.eval_every, eval_windows=args.eval_windows,
        seq_len=args.seq_len, split=args.split, virtual_stages=args.virtual_stages, device=args.device,
        emulate_gpu_speed=args.emulate_gpu_speed,
        split_by_speed=args.split_by_speed or plan.split is not None, split_boundaries=plan.split or (),
        precision=args.precision,
        steps=args.steps, microbatches=args.microbatches, batch_size=args.batch_size, lr=args.lr,
        schedule=args.schedule, **plan_codec_fields(plan.codecs, args.dp_codec, args.pp_codec),
        error_feedback=args.error_feedback,
        optimizer=args.optimizer, onebit_warmup_steps=args.onebit_warmup_steps, clip_grad_norm=args.clip_grad_norm,
        dp_hierarchical=args.dp_hierarchical,
        sync_every=args.sync_every, outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
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


HOST_OPTIONS = ("rdzv", "node", "print_torchrun")


def forwarded_arguments(args: Any) -> list[str]:
    """The training options of `args` that differ from their defaults, as command-line words
    (without --rdzv, --node and --print-torchrun): what every host's command repeats."""
    parser = argparse.ArgumentParser(add_help=False)
    add_train_arguments(parser)
    words: list[str] = []
    for action in parser._actions:
        value = getattr(args, action.dest)
        if action.dest in HOST_OPTIONS or value == action.default:
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            words.append(action.option_strings[0])
        else:
            words += [action.option_strings[0], str(value)]
    return words


def print_torchrun(args: Any, config: Any, out: Output) -> None:
    """One torchrun command per host of the plan (--print-torchrun)."""
    from geotrain.runtime.hosts import DEFAULT_PORT, host_layout, parse_endpoint, torchrun_commands

    hosts = host_layout(config.cluster, config.layout, args.cluster)
    endpoint = parse_endpoint(args.rdzv) if args.rdzv else (hosts.nodes[0].name, DEFAULT_PORT)
    commands = torchrun_commands(hosts, endpoint, forwarded_arguments(args))
    if args.json:
        out.emit_json({"nodes": [{"node": name, "ranks": list(hosts.node(name).ranks), "command": command}
                                 for name, command in commands]})
        return
    out.text(f"# one command per host; on each, LOCAL_RANK i runs the i-th of its plan ranks (rank s*R + r = "
             f"plan slot (s, r)); {hosts.nodes[0].name} hosts the rendezvous and prints the results")
    for name, command in commands:
        out.text(f"# node {name}: ranks {list(hosts.node(name).ranks)}\n{command}")


def host_rendezvous(args: Any, config: Any) -> Any:
    """The Rendezvous of --node/--rdzv (None on one host; other hosts awaited up to --comm-timeout). Under torchrun, the node (--node or
    GEOTRAIN_NODE) turns LOCAL_RANK into the plan rank, set as RANK; the rendezvous is torchrun's."""
    from geotrain.runtime.hosts import NODE_ENV, HostsError, Rendezvous, host_layout, parse_endpoint, plan_rank

    name, source = args.node, "--node"
    if name is None and under_torchrun() and os.environ.get(NODE_ENV):
        name, source = os.environ[NODE_ENV], NODE_ENV
    if name is None:
        if args.rdzv is not None:
            raise HostsError("--rdzv: needs --node NAME (which host this is)")
        return None
    hosts = host_layout(config.cluster, config.layout, args.cluster)
    node = hosts.node(name, source)
    if under_torchrun():
        os.environ["RANK"] = str(plan_rank(node, int(os.environ.get("LOCAL_RANK", "0")),
                                           int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        return None
    if args.rdzv is None:
        raise HostsError(f"--node: needs --rdzv HOST:PORT (the address of {hosts.nodes[0].name!r}, the host of rank 0)")
    visible = node.cuda_visible_devices()
    if visible is not None:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", visible)
    addr, port = parse_endpoint(args.rdzv)
    return Rendezvous(hosts, node.name, addr, port, timeout_s=config.comm_timeout_s)


def run(args: Any) -> int:
    from geotrain.runtime import build_report, launch, run_worker
    from geotrain.runtime.launcher import check_before_launch
    from geotrain.runtime.sequence_check import check_sequence_fits

    config = config_from_args(args)
    out = Output(json_mode=args.json)
    if args.print_torchrun:
        print_torchrun(args, config, out)
        return 0
    check_sequence_fits(config)  # before any process starts: a sequence too long for memory fails in one line
    rendezvous = host_rendezvous(args, config)
    stray = stray_torchrun_variables()
    if stray:
        print(f"geotrain: note: ignoring {', '.join(stray)} in the environment: this process was not started "
              f"by torchrun ({TORCHRUN_MARKER} is unset), so it launches its own workers", file=sys.stderr)
    if under_torchrun():
        held = check_before_launch(config, clear=os.environ["RANK"] == "0")  # noqa: F841 - held for the worker's life
        records = run_worker(config)
        if records is None:
            return 0
        report, wall_s = build_report(config, records), None
    else:
        with out.progress("training", config.steps) as progress:
            result = launch(config, progress=progress, rendezvous=rendezvous)
        report, wall_s = result.report, result.wall_s
        if report is None:  # another host runs rank 0 and prints the results
            node = rendezvous.hosts.node(rendezvous.node)
            if args.json:
                out.emit_json({"node": node.name, "ranks": list(node.ranks), "wall_s": wall_s})
            else:
                out.text(f"node {node.name}: ranks {list(node.ranks)} done in {wall_s:.1f} s; results on node "
                         f"{rendezvous.hosts.nodes[0].name} (rank 0)")
            return 0
    if args.json:
        out.emit_json({**report.to_json(), "wall_s": wall_s})
        return 0
    iteration_table(out, report)
    if report.validation:
        out.table("validation (held-out loss, nats)", ["after step", "loss"],
                  [[step, f"{loss:.4f}"] for step, loss in report.validation])
    out.table("summary (means over iterations after the first)", SUMMARY_COLUMNS, summary_rows([report]))
    out.text(f"stage boundaries {list(report.boundaries)} (split {args.split}"
             f"{', by speed' if config.split_by_speed else ''}{', from the plan' if config.split_boundaries else ''})")
    out.text(f"payload bytes per iteration: DP gradient per stage {list(report.dp_bytes_per_stage)}, "
             f"activations per replica per cut {report.pp_bytes_per_cut} (each way)")
    return 0
