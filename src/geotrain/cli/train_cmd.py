"""`geotrain train`: run a plan as S x R worker processes over emulated links, and compare the cost
model's prediction with the measured communication.

With --json, stdout is ONE JSON object: {"elastic", "plan", "stages", "replicas", "assignment", "losses",
"summary": {"first_loss", "final_loss", "replicas_in_sync", "iteration_s", "compute_s", "comm_measured_s",
"comm_predicted_s", "error_pct", "memory": {"per_rank": [{"rank", "weights", "gradients", "optimizer", "sync",
"state", "device", "host", "peak_rss", "peak_device", "predicted_state"}...] in bytes, "predicted_state_per_stage",
"state_error_pct"},
...}, "prediction", "bytes", "iterations": [...], "validation": [{"step", "loss"}...], "config", "wall_s"}; seconds are wall seconds of the emulated run (already multiplied by
--time-scale). An --elastic run has the same layout (TRAIN_JSON_KEYS; its summary holds the elastic facts:
replica_failures, rejoins, global_restarts, recovery_s, ...) with "group_records" and "events" in place of
"prediction", "bytes" and "iterations".

Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and TORCHELASTIC_RUN_ID set), this process is
one worker: nothing is launched, and rank 0 prints the results (see docs/history/runtime.md for several
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

from geotrain.cli.help_format import DefaultsHelpFormatter
from geotrain.cli.output import Output, plain_markup


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train", help="run a plan: pipeline x data-parallel training of your model on your data over emulated links",
        description="Launch one worker process per (stage, replica) slot of a plan (gloo on localhost), train "
                    "the model (--model) on the data (--data) with a torch.distributed.pipelining schedule, every "
                    "transfer slowed to the cluster's emulated link speed, and report measured vs predicted "
                    "communication per iteration and the validation loss.",
        formatter_class=DefaultsHelpFormatter)
    add_train_arguments(parser)
    parser.set_defaults(handler=run)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    from geotrain.cli.config_flags import add_config_flags

    parser.add_argument("--cluster", metavar="FILE|PRESET", help="cluster preset or YAML/JSON file (required)")
    parser.add_argument("--plan", metavar="PLAN.json", help="plan file (as `geotrain plan --json` writes; required)")
    parser.add_argument("--config", metavar="RUN.toml",
                        help="settings file (TOML, one table per section, as --print-config writes); flags override it")
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective settings as TOML and exit (alone: the defaults)")
    add_config_flags(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of tables")
    parser.add_argument("--rdzv", metavar="HOST:PORT",
                        help="several hosts: the rendezvous store, on the host of rank 0 (HOST: its address)")
    parser.add_argument("--node", metavar="NAME",
                        help="several hosts: run only the ranks whose devices have this `host` in the cluster file")
    parser.add_argument("--print-torchrun", action="store_true",
                        help="print one torchrun command per host of the cluster file (rendezvous: --rdzv, "
                             "default <rank 0's host>:29500) and exit")


def given_settings(args: Any) -> dict[str, dict[str, Any]]:
    """The settings of the --config file, overridden by the flags given (not yet the plan's)."""
    from geotrain.cli.config_flags import flag_settings
    from geotrain.runtime.config_file import merge_settings, read_config_file

    file = read_config_file(args.config) if args.config else {}
    return merge_settings(file, flag_settings(args))


def plan_settings(plan: Any) -> dict[str, dict[str, Any]]:
    """The settings a plan brings: its per-stage / per-cut codecs and its layer cut (flags and file override)."""
    settings: dict[str, dict[str, Any]] = {}
    if plan.codecs is not None:
        settings["comm"] = {"dp_codecs": tuple(plan.codecs.dp), "pp_codecs": tuple(plan.codecs.pp)}
    if plan.split is not None:
        settings["schedule"] = {"split_by_speed": True, "split_boundaries": tuple(plan.split.boundaries)}
    if plan.extra.get("wan_recipe") is not None:  # `geotrain plan --wan-recipe auto`: its outer codec on every stage
        from geotrain.cost.wan_recipe import WanRecipe

        recipe = WanRecipe.from_json(plan.extra["wan_recipe"], "plan")
        settings["optim"] = recipe.runtime_settings(plan.k)["optim"]
        settings.setdefault("comm", {})["dp_codecs"] = (recipe.codec,) * plan.stages
    if plan.extra.get("outer_state") is not None:  # `geotrain plan --outer-state host`: planned without it on devices
        settings.setdefault("optim", {})["outer_state"] = str(plan.extra["outer_state"])
    if plan.extra.get("batch_shares") is not None:  # `geotrain plan --wan-recipe auto` chose speed shares
        settings.setdefault("schedule", {})["batch_shares"] = str(plan.extra["batch_shares"].get("rule", "speed"))
    return settings


def config_from_args(args: Any) -> Any:
    """The RuntimeConfig the arguments describe (cluster, plan and --config file loaded and checked):
    the plan's settings, then the file's, then the flags'."""
    from geotrain.cli.config_flags import errors_name_flags
    from geotrain.cluster import load_cluster
    from geotrain.plan import Plan
    from geotrain.runtime import RuntimeConfig, RuntimeConfigError
    from geotrain.runtime.config import build_sections
    from geotrain.runtime.config_file import merge_settings

    missing = [flag for flag, value in (("--cluster", args.cluster), ("--plan", args.plan)) if value is None]
    if missing:
        raise RuntimeConfigError(f"train needs {' and '.join(missing)} (only --print-config runs without them)")
    settings = given_settings(args)
    cluster = load_cluster(args.cluster)
    plan = Plan.load(args.plan)
    assignment = plan.check_fits(cluster.n_devices, args.plan)
    shards = plan.check_shard_devices(cluster, args.plan) if plan.k > 1 else None  # FSDP2 slots: runtime/sharded.py
    note = plan.check_cluster(cluster, args.plan, args.cluster)  # a plan of another cluster: refused
    if note:
        print(f"geotrain: note: {note}", file=sys.stderr)
    from_plan = plan_settings(plan)
    unset = {section: {key: value for key, value in values.items() if key not in settings.get(section, {})}
             for section, values in from_plan.items()}  # the plan's, where neither a flag nor the file set them
    settings = merge_settings(from_plan, settings)
    if plan.split is not None:  # a plan's cut always weights the split by speed (it is cut by speed)
        settings["schedule"]["split_by_speed"] = True
    with errors_name_flags(args, (args.plan, unset)):
        return RuntimeConfig(cluster, assignment, plan.method if plan.method is not None else Path(args.plan).stem,
                             **build_sections(settings), shards=shards)


def print_config(args: Any) -> None:
    """--print-config: the effective settings as TOML (with --cluster and --plan: the plan's too)."""
    from geotrain.cli.config_flags import errors_name_flags
    from geotrain.runtime.config import build_sections
    from geotrain.runtime.config_file import config_toml

    if args.cluster is not None and args.plan is not None:
        sections = config_from_args(args).sections()
    else:
        with errors_name_flags(args):
            sections = build_sections(given_settings(args))
    sys.stdout.write(config_toml(sections))


TRAIN_JSON_KEYS = ("elastic", "plan", "stages", "replicas", "assignment", "losses", "summary", "validation", "config",
                   "wall_s")
"""The top-level keys of every `train --json` object, elastic or not (the summary: SUMMARY_JSON_KEYS at least)."""
SUMMARY_JSON_KEYS = ("first_loss", "final_loss", "replicas_in_sync")


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


def table_units(time_scale: float, emulate_gpu_speed: bool) -> str:
    """What the iteration table's seconds are: wall seconds (links emulated at the time scale, if any), and the
    compute column's, which under --emulate-gpu-speed are emulated seconds at each device's GPU speed."""
    if not time_scale > 0:
        return "seconds"
    links = f"wall seconds, links emulated at --time-scale {time_scale:g}"
    return f"{links}; compute: emulated seconds at each GPU's speed" if emulate_gpu_speed else links


def iteration_table(out: Output, report: Any, units: str = "seconds") -> None:
    """The per-step table; `units` (table_units) says what its seconds are."""
    rows = [[row.step, f"{row.loss:.4f}", f"{row.iteration_s:.3f}", f"{row.compute_s:.3f}",
             f"{row.comm_predicted_s:.3f}", f"{row.comm_measured_s:.3f}",
             f"{row.dp_measured_s:.3f}", f"{row.pp_measured_s:.3f}",
             "-" if row.error_pct is None else f"{row.error_pct:+.1f}"] for row in report.rows]
    how = ("by the run's progress (ranks took different numbers of steps: a row holds each rank's steps at that "
           "step of the equal schedule, the slowest rank's seconds; comm = dp + pp, compared over the run only; "
           f"{units})" if report.uneven else f"(comm = dp + pp; {units})")
    out.table(f"iterations of plan {report.plan} {how}",
              ["step", "loss", "iteration", "compute", "comm predicted", "comm measured", "dp meas.", "pp meas.",
               "error %"], rows)


def validation_tables(out: Output, report: Any) -> None:
    """The global model's evaluations by the run's completed steps; a replica's own evaluations (asynchronous
    --eval-local) apart, labelled by replica."""
    if report.validation:
        out.table("validation (held-out loss, nats)", ["after step", "loss"],
                  [[step, f"{loss:.4f}"] for step, loss in report.validation])
    if report.replica_validation:
        out.table("validation by each replica of the global model it held (held-out loss, nats)",
                  ["replica", "after step (the global model's)", "loss"],
                  [[replica, step, f"{loss:.4f}"] for replica, step, loss in report.replica_validation])


def summary_rows(reports: list[Any]) -> list[list[Any]]:
    rows = []
    for report in reports:
        s = report.summary()
        rows.append([report.plan, f"{s['iteration_s']:.3f}", f"{s['comm_predicted_s']:.3f}",
                     f"{s['comm_measured_s']:.3f}", f"{s['error_pct']:+.1f}",
                     f"{s['first_loss']:.4f} -> {s['final_loss']:.4f}"])
    return rows


SUMMARY_COLUMNS = ["plan", "iteration s", "predicted comm s", "measured comm s", "error %", "loss"]


def forwarded_arguments(args: Any) -> list[str]:
    """The training options of `args` as command-line words (without --rdzv, --node, --print-torchrun and
    --config: the settings of the file and the flags, as flags): what every host's command repeats."""
    from geotrain.cli.config_flags import config_argv
    from geotrain.runtime.config import build_sections

    words = [word for flag, value in (("--cluster", args.cluster), ("--plan", args.plan)) if value is not None
             for word in (flag, value)]
    return words + config_argv(build_sections(given_settings(args))) + (["--json"] if args.json else [])


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
    return Rendezvous(hosts, node.name, addr, port, timeout_s=config.reliability.comm_timeout_s)


def run(args: Any) -> int:
    from geotrain.cli.run_dir_args import open_run_dir, run_dir_json, settle_run_dir, watching
    from geotrain.runtime import build_report, launch
    from geotrain.runtime.launcher import check_before_launch
    from geotrain.runtime.sequence_check import check_sequence_fits
    from geotrain.runtime.training_data import check_training_data

    if args.print_config:
        print_config(args)
        return 0
    config = config_from_args(args)
    out = Output(json_mode=args.json)
    if args.print_torchrun:
        print_torchrun(args, config, out)
        return 0
    check_sequence_fits(config)  # before any process starts: a sequence too long for memory fails in one line
    check_training_data(config.data.data, config.data.val_fraction, config.sequence_length,
                        evaluates=bool(config.data.eval_every))  # and a missing, empty or too short --data
    if not under_torchrun():
        say_what_runs(args, config, out)
    if config.reliability.elastic:
        return run_elastic(args, config, out)
    rendezvous = host_rendezvous(args, config)
    stray = stray_torchrun_variables()
    if stray:
        print(f"geotrain: note: ignoring {', '.join(stray)} in the environment: this process was not started "
              f"by torchrun ({TORCHRUN_MARKER} is unset), so it launches its own workers", file=sys.stderr)
    # run_lock: a default run directory's, held for the launch's life (retention elsewhere leaves it alone)
    config, run_lock = settle_run_dir(config, local=rendezvous is None and not under_torchrun())  # noqa: F841
    if under_torchrun():
        # Imported here: torch.distributed.pipelining and dynamo (~1.3 s) that a launcher does not need.
        from geotrain.runtime import run_worker

        held = check_before_launch(config, clear=os.environ["RANK"] == "0")  # noqa: F841 - held for the worker's life
        records = run_worker(config)
        if records is None:
            return 0
        report, wall_s = build_report(config, records), None
    else:
        try:
            with out.progress("training", config.run.steps) as progress, watching(config):
                result = launch(config, progress=progress, rendezvous=rendezvous,
                                on_start=lambda: open_run_dir(config))
        except KeyboardInterrupt:
            return interrupted(args, config)
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
        out.emit_json({**report.to_json(), "elastic": False, "wall_s": wall_s, **run_dir_json(config)})
        return 0
    iteration_table(out, report, table_units(config.emulation.time_scale, config.emulation.emulate_gpu_speed))
    validation_tables(out, report)
    out.table("summary (means over iterations after the first)", SUMMARY_COLUMNS, summary_rows([report]))
    schedule = config.schedule
    out.text(f"stage boundaries {list(report.boundaries)} (split {schedule.split}"
             f"{', by speed' if schedule.split_by_speed else ''}"
             f"{', from the plan' if schedule.split_boundaries else ''})")
    out.text(f"payload bytes per iteration: DP gradient per stage {list(report.dp_bytes_per_stage)}, "
             f"activations per replica per cut {report.pp_bytes_per_cut} (each way)")
    out.text(f"samples per replica {list(report.samples)} (--batch-shares {schedule.batch_shares}); step "
             f"{report.step_s:.3f} s; compute fraction per device: "
             + ", ".join(f"{name} {f:.2f}" for name, f in report.compute_fraction.items()))
    if report.memory is not None:
        out.text(memory_line(report.memory))
    return 0


def memory_line(memory: dict[str, Any]) -> str:
    """One line of what the busiest rank held at the end (runtime/memory_use.py) beside the planner's prediction."""
    rank = max(memory["per_rank"], key=lambda row: row["state"])
    parts = ", ".join(f"{key} {rank[key] / 1e6:.3g}" for key in ("weights", "gradients", "optimizer", "sync"))
    parts += f"; on the device {rank['device'] / 1e6:.4g} MB, in host memory {rank['host'] / 1e6:.4g} MB"
    predicted = rank["predicted_state"]
    versus = "" if predicted is None else (f"; the planner's {predicted / 1e6:.4g} MB "
                                           f"({(rank['state'] - predicted) / predicted * 100:+.2f}%)")
    peaks = [row["peak_rss"] / 1e9 for row in memory["per_rank"]]
    device = [row["peak_device"] / 1e9 for row in memory["per_rank"] if row.get("peak_device") is not None]
    on_device = f"; peak on the GPU {min(device):.3g}-{max(device):.3g} GB" if device else ""
    return (f"memory per rank at the end (rank {rank['rank']}, the most): state {rank['state'] / 1e6:.4g} MB ({parts})"
            f"{versus}{on_device}; peak resident {min(peaks):.2f}-{max(peaks):.2f} GB per process (torch's runtime "
            f"included)")


def interrupted(args: Any, config: Any) -> int:
    """After a Ctrl-C has stopped the workers: the last checkpoint and the command that resumes from it
    (stderr); exit status 130, as the shell's for SIGINT."""
    from geotrain.cli.resume_hint import interrupted_lines
    from geotrain.procs.supervisor import EXIT_INTERRUPTED

    for line in interrupted_lines(config, getattr(args, "words", ())):
        print(line, file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def say_what_runs(args: Any, config: Any, out: Output) -> None:
    """Before the run: the outer-settings note of a short --sync-every run (stderr), and in text mode one line
    of what runs (sync, codecs, recipe, batch per replica against the plan's job)."""
    from geotrain.cli.resume_hint import resume_banner
    from geotrain.cli.run_line import async_validation_note, outer_settings_note, what_runs
    from geotrain.plan import Plan

    for note in (outer_settings_note(config), async_validation_note(config)):
        if note:
            print(note, file=sys.stderr)
    resumed = resume_banner(config)  # (before any process starts: no checkpoint to resume is one line)
    if not args.json:
        out.text(what_runs(config, Plan.load(args.plan)))
        if resumed is not None:
            out.text(resumed)


def run_elastic(args: Any, config: Any, out: Output) -> int:
    """`train --elastic`: replica groups on torchft (geotrain.runtime.elastic), on this host only."""
    from geotrain.runtime import RuntimeConfigError
    from geotrain.runtime.elastic.launch import launch_elastic

    if args.node or args.rdzv or under_torchrun():
        raise RuntimeConfigError("--elastic: runs on this host only (its launcher starts every replica group); "
                                 "drop --node/--rdzv and do not start it under torchrun")
    from geotrain.cli.run_dir_args import open_run_dir, run_dir_json, settle_run_dir, watching

    config, _ = settle_run_dir(config, local=True, default=False)  # only when --run-dir is given
    open_run_dir(config)
    events: list[str] = []

    def on_event(line: str) -> None:  # as it happens, and again under the table
        events.append(line)
        out.stderr.print(f"geotrain: {plain_markup(line)}", soft_wrap=True, highlight=False)

    try:
        with out.progress("training (elastic)", config.run.steps) as progress, watching(config):
            summary = launch_elastic(config, progress=progress, on_event=on_event)
    except KeyboardInterrupt:
        return interrupted(args, config)
    if args.json:
        out.emit_json({**summary.to_json(config), "events": events, **run_dir_json(config)})
        return 0
    out.table("elastic run", ["steps", "final loss", "val loss", "replica failures", "partitions", "rejoins",
                              "global restarts", "max param diff", "recovery s", "stall s", "emulated s", "wall s"],
              [[summary.steps, f"{summary.losses[-1]:.4f}" if summary.losses else "-",
                "-" if summary.val_loss is None else f"{summary.val_loss:.4f}", summary.replica_failures,
                summary.partitions, summary.rejoins, summary.global_restarts,
                f"{summary.max_param_diff_across_replicas:.3g}",
                " ".join(f"{s:.1f}" for s in summary.recovery_s + summary.partition_recovery_s) or "-",
                f"{summary.stall_s:.1f}", "-" if summary.train_emulated_s is None else f"{summary.train_emulated_s:.1f}",
                f"{summary.wall_s:.1f}"]])
    if config.optim.outer_sync != "sync":  # the servers' hosts: runtime/elastic/async_group.py, async_regions.py
        out.table("global model", ["elections", "lost updates", "resent updates"],
                  [[summary.elections, summary.lost_updates, summary.resent_updates]])
    for line in events:
        out.text(line)
    return 0
