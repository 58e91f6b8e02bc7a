"""A plain torch.distributed.pipelining script (nothing geotrain-specific): one MLP stage per rank, GPipe.

    torchrun --standalone --nproc-per-node 4 examples/pipeline_train.py --steps 5
    geotrain emulate --cluster seed-geo --devices 0,8,16,24 -- examples/pipeline_train.py --steps 5
The last rank prints, per step, the mean micro-batch loss and the wall seconds of the step.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from geotrain.procs.exit import exit_without_teardown


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    width_in = 64 if rank == 0 else args.hidden
    width_out = 1 if rank == world - 1 else args.hidden
    stage_module = nn.Sequential(nn.Linear(width_in, width_out), nn.Tanh() if rank < world - 1 else nn.Identity())
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=nn.functional.mse_loss)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1234)
    dist.barrier()
    for step in range(args.steps):
        start = time.perf_counter()
        x = torch.randn(args.batch, 64, generator=data)
        y = x[:, :1] * 0.5 - x[:, 1:2]
        optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        optimizer.step()
        dist.barrier()
        if rank == world - 1:
            print(f"step {step} loss {torch.stack(losses).mean().item():.8f} "
                  f"time {time.perf_counter() - start:.4f}s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13 + gloo: gloo's worker thread can still be releasing the last collective's tensors when the
    # interpreter shuts down, which aborts a rank that succeeded (exit 134). Run the exit handlers, then leave
    # without the shutdown (under `geotrain emulate` too: its report is one of those handlers).
    exit_without_teardown(0, join_threads=False)
