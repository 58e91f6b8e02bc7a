"""`geotrain calibrate`: time a few training steps of your model and write what the planner charges compute at.

    geotrain calibrate --model hf:gpt2-tiny --batch-size 8 --cluster my-cluster.yaml --out calibration.json
    geotrain plan --cluster my-cluster.yaml --job my-job.yaml --calibration calibration.json --wan-recipe auto

The file (cost/calibration.py) records the measured seconds per step and the GPU type the measurement stands
for: `--as-gpu NAME`; else, on a GPU, its own type; else the fastest GPU of `--cluster` (the emulator runs the
fastest GPU at this machine's speed, so a CPU calibration predicts emulated runs). With --json stdout is ONE JSON
object: the file's.
"""

from __future__ import annotations

from typing import Any

from geotrain.cli.arg_types import output_file
from geotrain.cli.help_format import DefaultsHelpFormatter
from geotrain.cli.output import Output, write_json_file
from geotrain.errors import GeotrainError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="time a few training steps of a model: the compute speed plan --calibration charges",
        description="Time a few training steps of a model on this machine; write the calibration the planner "
                    "reads (plan --calibration).", formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--model", default="tiny", metavar="SPEC",
                        help="tiny, hf:PRESET|config.json|DIR, path/to/file.py:function or package.module:function")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step (a replica's batch in train)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="tokens per sequence (default: the model's context, else 128)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (their median is recorded)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the steps run")
    parser.add_argument("--as-gpu", default=None, metavar="NAME",
                        help="the GPU type this measurement stands for (default: the GPU's own on --device cuda, "
                             "else the fastest GPU of --cluster)")
    parser.add_argument("--cluster", default=None, metavar="FILE|PRESET",
                        help="the cluster whose fastest GPU a CPU measurement stands for (as the emulator runs it)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (train's ranks run with --threads, default 1: measure as they compute)")
    parser.add_argument("--seed", type=int, default=0, help="the model's and the tokens' seed")
    parser.add_argument("--out", default=None, type=output_file, metavar="FILE", help="write the calibration here")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    parser.set_defaults(handler=run)


def stands_for(args: Any) -> str:
    """The GPU type the measurement stands for (module doc); GeotrainError when nothing says."""
    from geotrain.cost.gpus import gpu_peak_flops

    if args.as_gpu is not None:
        gpu_peak_flops(args.as_gpu)  # an unknown name: one line with the known ones
        return args.as_gpu
    if args.device == "cuda":
        import torch

        from geotrain.cluster.gpus import UNKNOWN_GPU, gpu_type_of

        gpu = gpu_type_of(torch.cuda.get_device_name())
        if gpu == UNKNOWN_GPU:
            raise GeotrainError(f"calibrate: this GPU ({torch.cuda.get_device_name()}) is not in the GPU table; "
                                "say which type it stands for with --as-gpu NAME")
        return gpu
    if args.cluster is None:
        raise GeotrainError("calibrate: say which GPU this machine's speed stands for: --as-gpu NAME, or --cluster C "
                            "(its fastest GPU, as the emulator runs it)")
    from geotrain.cluster import load_cluster
    from geotrain.cost.gpus import gpu_peak_flops

    cluster = load_cluster(args.cluster)
    return max(set(cluster.gpus), key=gpu_peak_flops)


def run(args: Any) -> int:
    out = Output(json_mode=args.json)
    for name in ("batch_size", "steps", "threads"):
        if getattr(args, name) < 1:
            raise GeotrainError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or (args.seq_len is not None and args.seq_len < 1):
        raise GeotrainError(f"--warmup must be >= 0 and --seq-len >= 1, got {args.warmup}, {args.seq_len}")
    gpu = stands_for(args)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise GeotrainError("calibrate --device cuda: torch sees no CUDA device here")
    from geotrain.cost.calibration import Calibration
    from geotrain.models.options import ModelOptions
    from geotrain.models.spec import load_model_spec
    from geotrain.runtime.calibrate import measure_step_seconds

    import torch

    torch.set_num_threads(args.threads)
    model = load_model_spec(args.model, ModelOptions(seed=args.seed))
    seq_len = args.seq_len or model.context or 128
    if model.context is not None and seq_len > model.context:
        raise GeotrainError(f"--seq-len {seq_len} is longer than the model's context ({model.context} tokens)")
    with out.progress(f"timing {args.warmup + args.steps} steps of {args.model}", 1):
        seconds = measure_step_seconds(model, args.batch_size, seq_len, steps=args.steps, warmup=args.warmup,
                                       device=args.device, seed=args.seed)
    calibration = Calibration(model=args.model, params=model.num_parameters(), tokens_per_step=args.batch_size * seq_len,
                              seconds=seconds, device=args.device, stands_for=gpu)
    doc = calibration.to_json()
    if args.out:
        write_json_file(doc, args.out)
    if args.json:
        out.emit_json(doc)
        return 0
    out.table(f"calibration of {args.model}", ["", "value"],
              [["parameters", f"{calibration.params:,}"],
               ["tokens per step", f"{calibration.tokens_per_step:,} ({args.batch_size} x {seq_len})"],
               ["seconds per step (median)", f"{calibration.seconds_per_step:.4g} ({args.steps} steps on {args.device})"],
               ["stands for", gpu],
               ["utilisation of its peak", f"{calibration.utilisation:.3g}"]])
    if args.out:
        out.text(f"calibration written to {args.out}; plan with --calibration {args.out}")
    return 0
