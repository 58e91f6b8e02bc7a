"""A user's own loop with `DiLoCo(local_steps="adaptive")`: each site takes inner steps in proportion to its speed.

Run it on a mixed cluster, one rank per site, each computing at its GPU's speed (A100, V100, T4):
    geotrain emulate --cluster examples/clusters/mixed-gpus-3x2.yaml --devices 0,2,4 --emulate-gpu-speed \
        --compute-clock cpu -- examples/adaptive_diloco.py
    ... -- examples/adaptive_diloco.py --local-steps equal      # H on every site: the T4 sets the pace
    ... -- examples/adaptive_diloco.py --outer-sync async       # H each, no waiting: the global model's server
(--compute-clock cpu: each rank's compute counted in its CPU seconds, so other load on this machine does not
skew the emulated GPU speeds.)
Under `geotrain emulate` DiLoCo times the inner steps by the rank's emulated clock (geotrain.emulate.emulated_clock),
so the A100 rank counts as an A100 though every rank runs on this machine's CPU. The loop is the ordinary one
(zero_grad, backward, step) and ends after --periods outer syncs on every rank (`while diloco.outer_step < N`;
asynchronous, `outer_step` counts the replicas' outer gradients in the global model: N = periods x replicas, the
synchronous run's budget, whichever replicas send them).
An MLP from its config learns a fixed random teacher on synthetic data (no downloads). Each rank prints one line
at the end: its inner steps, the mean training loss of its first and last periods, the validation loss of the
shared model before and after the last sync, and its compute fraction (seconds between inner steps over the
run's seconds, both on the emulated clock: wall seconds without emulation), over the run and after the first two
periods (which adaptive runs with H steps everywhere: nothing is measured yet).
"""

import argparse
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from geotrain.diloco import DiLoCo
from geotrain.procs.exit import exit_without_teardown

WARMUP_PERIODS = 2
"""Adaptive: period 1 runs H steps everywhere (nothing measured), period 1's times travel during period 2."""


@dataclass(frozen=True)
class MLPConfig:
    """The student: `depth` hidden layers of `hidden` units on `inputs` features, one output."""

    inputs: int = 32
    hidden: int = 1024
    depth: int = 2


def build_mlp(config: MLPConfig) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = config.inputs
    for _ in range(config.depth):
        layers += [nn.Linear(width, config.hidden), nn.Tanh()]
        width = config.hidden
    return nn.Sequential(*layers, nn.Linear(width, 1))


def teacher(inputs: int) -> torch.Tensor:
    """The function to learn, y = tanh(x @ w): w fixed (seed 7), the same on every rank."""
    return torch.randn(inputs, 1, generator=torch.Generator().manual_seed(7)) * 2.0 / inputs ** 0.5


def validation_loss(model: nn.Module, x: torch.Tensor, w: torch.Tensor) -> float:
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), torch.tanh(x @ w)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--periods", type=int, default=8, help="outer syncs (N in `while outer_step < N`)")
    parser.add_argument("--sync-every", type=int, default=16, help="H: the mean inner steps per replica per period")
    parser.add_argument("--local-steps", choices=("adaptive", "equal"), default="adaptive",
                        help="synchronous outer syncs only (asynchronous: H on every replica)")
    parser.add_argument("--outer-lr", type=float, default=1.0,
                        help="outer learning rate (with --outer-momentum 0: the replicas' models averaged, what "
                             "`geotrain plan --wan-recipe auto` chooses under 100 outer steps; DiLoCo's 0.7 and 0.9 "
                             "are made for 100+)")
    parser.add_argument("--outer-momentum", type=float, default=0.0, help="outer Nesterov momentum")
    parser.add_argument("--outer-sync", choices=("sync", "async"), default="sync",
                        help="async: a replica that ends its H steps sends its outer gradient to the global model's "
                             "server and goes on from the model it gets back, without waiting for the others")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = MLPConfig(hidden=args.hidden)
    torch.manual_seed(0)  # the same initial model on every rank
    model = build_mlp(config)
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    val_x = torch.randn(512, config.inputs, generator=torch.Generator().manual_seed(99))
    w = teacher(config.inputs)
    val_before = validation_loss(model, val_x, w)
    data = torch.Generator().manual_seed(1000 + rank)  # each replica its own samples
    losses_by_period: list[list[float]] = [[]]
    asynchronous = args.outer_sync == "async"
    local_steps = "equal" if asynchronous else args.local_steps
    diloco = DiLoCo(model, inner, sync_every=args.sync_every, local_steps=local_steps, codec="int8-block",
                    outer_lr=args.outer_lr, outer_momentum=args.outer_momentum, asynchronous=asynchronous)
    target = args.periods * (dist.get_world_size() if asynchronous else 1)
    dist.barrier()  # the sites start together (set-up counts at this machine's speed, the loop at each GPU's)
    with diloco:
        start_s = diloco.clock()
        warm = (0.0, start_s)
        while diloco.outer_step < target:
            x = torch.randn(args.batch, config.inputs, generator=data)
            loss = nn.functional.mse_loss(model(x), torch.tanh(x @ w))
            inner.zero_grad()
            loss.backward()
            inner.step()  # the outer sync runs from this step's post hook when this replica's H_r is reached
            losses_by_period[-1].append(loss.item())
            if len(losses_by_period) <= (diloco.asynchronous.pushes if asynchronous else diloco.outer_step):
                losses_by_period.append([])
                if diloco.outer_step == WARMUP_PERIODS:
                    warm = (diloco.step_s, diloco.clock())
    # after the block: the last sync (asynchronous: the final exchange, sent on leaving it) is done, and every rank
    # holds the same model
    val_after = validation_loss(model, val_x, w)
    end_s = diloco.clock()
    run_s = end_s - start_s
    # the first periods share the steps equally (no step time measured yet): the fraction after them as well
    steady = (diloco.step_s - warm[0]) / max(end_s - warm[1], 1e-9)
    first, last = losses_by_period[0], [period for period in losses_by_period if period][-1]
    per_period = [h["steps"][rank] for h in diloco.sync.history] if local_steps == "adaptive" else []
    periods = diloco.outer_step // dist.get_world_size() if asynchronous else diloco.outer_step
    # one write of the whole line, newline included: the ranks share one stdout, and unbuffered (PYTHONUNBUFFERED)
    # print writes its `end` separately, after which another rank's line could land
    print(f"rank {rank} outer_sync {args.outer_sync} local_steps {local_steps} inner_steps {diloco.inner_steps} "
          f"periods {periods} outer_updates {diloco.outer_step} steps_per_period {per_period} "
          f"train_loss_first_period {sum(first) / len(first):.4f} train_loss_last_period {sum(last) / len(last):.4f} "
          f"val_loss_before {val_before:.4f} val_loss_after {val_after:.4f} "
          f"compute_s {diloco.step_s:.3f} run_s {run_s:.3f} compute_fraction {diloco.step_s / run_s:.3f} "
          f"compute_fraction_after_period_{WARMUP_PERIODS} {steady:.3f}\n", end="", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13 + gloo: gloo's worker thread can still be releasing the last collective's tensors when the
    # interpreter shuts down, which aborts a rank that succeeded (exit 134). Run the exit handlers, then leave
    # without the shutdown (under `geotrain emulate` too: its report is one of those handlers).
    exit_without_teardown(0, join_threads=False)
