"""`geotrain bench runtime`: the planner's plan vs a random plan vs the worst region-crossing plan,
each trained for real over emulated geo links in one invocation (see geotrain.runtime.bench)."""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.cli.arg_types import seed

NAME = "runtime"
HELP = "train the planned, a random and a region-crossing plan over emulated geo links; measured vs predicted"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices-per-region", type=int, default=4, help="devices in each of the two regions")
    parser.add_argument("--stages", type=int, default=2, help="pipeline stages")
    parser.add_argument("--replicas", type=int, default=4, help="data-parallel replicas")
    parser.add_argument("--inter-gbps", type=float, default=0.005, help="bandwidth between the regions, Gbit/s")
    parser.add_argument("--inter-ms", type=float, default=40.0, help="latency between the regions, ms")
    parser.add_argument("--intra-gbps", type=float, default=10.0, help="bandwidth inside a region, Gbit/s")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every emulated link time by this")
    parser.add_argument("--steps", type=int, default=6, help="training iterations per plan (the first is not averaged)")
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches per iteration")
    parser.add_argument("--dp-codec", default="none", help="gradient codec (name only)")
    parser.add_argument("--pp-codec", default="none", help="activation dtype on the wire: none (fp32), fp16, bf16")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the cluster, the random plan, the search and the model")
    parser.add_argument("--cost-model", default="schedule", choices=["schedule", "ring", "yuan"],
                        help="the model whose predicted iteration time heads the table (schedule: event simulation "
                             "with each slot's measured work, the optimizer's after its all-reduce; ring/yuan: "
                             "their comm + work, no overlap)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    from geotrain.cli.run_dir_args import add_bench_run_dir

    add_bench_run_dir(parser)


def run(args: Any) -> int:
    from geotrain.cli.output import Output
    from geotrain.cli.placement_args import assignment_rows, region_legend
    from geotrain.runtime.bench import RuntimeBenchConfig, run_runtime_bench
    from geotrain.runtime.predict import ITERATION_MODELS

    config = RuntimeBenchConfig(devices_per_region=args.devices_per_region, stages=args.stages, replicas=args.replicas,
                                inter_gbps=args.inter_gbps, inter_ms=args.inter_ms, intra_gbps=args.intra_gbps,
                                time_scale=args.time_scale, steps=args.steps, microbatches=args.microbatches,
                                dp_codec=args.dp_codec, pp_codec=args.pp_codec, seed=args.seed,
                                cost_model=args.cost_model, run_dir=args.run_dir)
    out = Output(json_mode=args.json)
    with out.progress("bench runtime", 3 * config.steps) as progress:
        order = {"planned": 0, "random": 1, "crossing": 2}
        bench = run_runtime_bench(config, lambda label, done, total: progress(order[label] * total + done, 3 * total))
    if args.json:
        out.emit_json(bench.to_json())
        return 0
    model = config.cost_model
    rows = []
    for plan in bench.plans:
        s = plan.report.summary()
        rows.append([plan.label, plan.chosen_by, f"{s['iteration_s']:.3f}", f"{s['iteration_predicted_s'][model]:.3f}",
                     f"{s['iteration_error_pct'][model]:+.1f}", f"{s['compute_s']:.3f}",
                     f"{s['comm_predicted_s']:.3f}", f"{s['comm_measured_s']:.3f}", f"{s['error_pct']:+.1f}",
                     f"{bench.ratio(plan.label):.2f}", f"{s['final_loss']:.4f}"])
    out.table(f"{config.stages} stages x {config.replicas} replicas on {bench.cluster.name} (time scale "
              f"{config.time_scale:g}); seconds per iteration, means of iterations 2..{config.steps}",
              ["plan", "chosen by", "iteration", f"{model} pred.", "error %", "compute", "comm pred. (yuan)",
               "comm meas.", "error %", "iter. / planned", "final loss"], rows, right_align_from=2)
    out.table("iteration seconds predicted by each model (error = measured vs predicted)",
              ["plan", "emulated", *(f"{m}" for m in ITERATION_MODELS), *(f"{m} err %" for m in ITERATION_MODELS)],
              [[p.label, f"{p.report.summary()['iteration_s']:.3f}",
                *(f"{p.report.summary()['iteration_predicted_s'][m]:.3f}" for m in ITERATION_MODELS),
                *(f"{p.report.summary()['iteration_error_pct'][m]:+.1f}" for m in ITERATION_MODELS)]
               for p in bench.plans], right_align_from=1)
    clock = [p for p in bench.plans if "iteration_emulated_s" in p.report.summary()]
    if clock:
        out.table("on the emulated clock (step period, emulated seconds; compute at real speed, links unscaled)",
                  ["plan", "emulated", *(f"{m}" for m in ITERATION_MODELS), *(f"{m} err %" for m in ITERATION_MODELS)],
                  [[p.label, f"{p.report.summary()['iteration_emulated_s']:.3f}",
                    *(f"{p.report.summary()['iteration_predicted_emulated_s'][m]:.3f}" for m in ITERATION_MODELS),
                    *(f"{p.report.summary()['iteration_emulated_error_pct'][m]:+.1f}" for m in ITERATION_MODELS)]
                   for p in clock], right_align_from=1)
    out.table("predicted vs measured, per term (s)", ["plan", "dp pred.", "dp meas.", "pp pred.", "pp meas."],
              [[p.label, *(f"{p.report.summary()[k]:.3f}" for k in
                           ("dp_predicted_s", "dp_measured_s", "pp_predicted_s", "pp_measured_s"))] for p in bench.plans])
    for plan in bench.plans:
        out.table(f"{plan.label}: assignment", ["", *(f"r{r}" for r in range(config.replicas))],
                  assignment_rows(bench.cluster, plan.report.assignment))
    out.text(region_legend(bench.cluster))
    out.text(f"payload bytes per iteration: DP gradient per stage {list(bench.expected_dp_bytes)}, activations per "
             f"replica per cut {bench.expected_pp_bytes} (each way)")
    return 0
