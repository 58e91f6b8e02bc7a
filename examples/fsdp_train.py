"""A plain FSDP2 (`fully_shard`) training script (nothing geotrain-specific): a small MLP, a few SGD steps.

    torchrun --standalone --nproc-per-node 4 examples/fsdp_train.py --steps 5
    geotrain emulate --cluster seed-geo --devices 0,8,16,24 -- examples/fsdp_train.py --steps 5
Rank 0 prints, per step, the loss averaged over ranks and the wall seconds of the step.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from geotrain.procs.exit import exit_without_teardown


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)  # parameters all-gathered per layer, gradients reduce-scattered
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)
    dist.barrier()
    for step in range(args.steps):
        start = time.perf_counter()
        x = torch.randn(args.batch, 64, generator=data)
        loss = nn.functional.mse_loss(model(x), x[:, :1] * 0.5 - x[:, 1:2])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        dist.barrier()
        if rank == 0:
            print(f"step {step} loss {mean_loss.item() / world:.8f} time {time.perf_counter() - start:.4f}s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13 + gloo: gloo's worker thread can still be releasing the last collective's tensors when the
    # interpreter shuts down, which aborts a rank that succeeded (exit 134). Run the exit handlers, then leave
    # without the shutdown (under `geotrain emulate` too: its report is one of those handlers).
    exit_without_teardown(0, join_threads=False)
