"""Sharded replicas: FSDP2 shards the model inside each site, geotrain's DiLoCo syncs across sites per shard.

    torchrun --standalone --nproc-per-node 4 examples/hsdp_diloco_train.py --periods 4
    geotrain emulate --cluster examples/clusters/lab-2x2.yaml --devices 0,1,2,3 -- examples/hsdp_diloco_train.py
A (replicate, shard) device mesh of SITES x (world / SITES) ranks: consecutive ranks form a site (the emulator's
devices 0,1 are region east, 2,3 west), `fully_shard` on the shard dimension (parameters all-gathered and
gradients reduce-scattered inside the site, every step), `DiLoCo(group=mesh["replicate"].get_group())` across
sites: each rank's outer sync averages its own shard with the same shard at the other sites, every --sync-every
steps, through --codec with error feedback, in --fragments overlapped by --delay steps. Every rank prints one
line: its site and shard, the elements of the shard it holds (anchors and residuals are that size), the mean
loss of its first and last periods, and its shard's float64 sum (equal for the same shard at every site).
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from geotrain.diloco import DiLoCo
from geotrain.procs.exit import exit_without_teardown


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sites", type=int, default=2, help="replicas (the mesh's replicate dimension)")
    parser.add_argument("--periods", type=int, default=4)
    parser.add_argument("--sync-every", type=int, default=4)
    parser.add_argument("--fragments", type=int, default=2)
    parser.add_argument("--delay", type=int, default=1)
    parser.add_argument("--codec", default="int8-block")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    if world % args.sites:
        raise SystemExit(f"hsdp_diloco_train: {world} ranks do not split into {args.sites} sites")
    mesh = init_device_mesh("cpu", (args.sites, world // args.sites), mesh_dim_names=("replicate", "shard"))
    site, shard = mesh["replicate"].get_local_rank(), mesh["shard"].get_local_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, args.hidden), nn.Tanh(), nn.Linear(args.hidden, args.hidden), nn.Tanh(),
                          nn.Linear(args.hidden, 1))
    teacher = torch.randn(32, generator=torch.Generator().manual_seed(7))
    shard_mesh = mesh["shard"]
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=shard_mesh)
    fully_shard(model, mesh=shard_mesh)
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(1000 * dist.get_rank())
    losses = []
    with DiLoCo(model, inner, sync_every=args.sync_every, fragments=args.fragments, delay=args.delay,
                codec=args.codec, outer_lr=1.0, outer_momentum=0.0, group=mesh["replicate"].get_group()) as diloco:
        while diloco.outer_step < args.periods:
            x = torch.randn(args.batch, 32, generator=data)
            loss = nn.functional.mse_loss(model(x).squeeze(-1), torch.tanh(x @ teacher))
            inner.zero_grad()
            loss.backward()
            inner.step()
            losses.append(loss.item())
    local = [p.to_local().detach() for p in model.parameters()]
    every = args.sync_every
    # one write of the whole line, newline included: the ranks share one stdout (see adaptive_diloco.py)
    print(f"site {site} shard {shard}: holds {sum(t.numel() for t in local)} of "
          f"{sum(p.numel() for p in model.parameters())} elements; loss {sum(losses[:every]) / every:.4f} -> "
          f"{sum(losses[-every:]) / every:.4f} (first -> last period); shard sum "
          f"{sum(float(t.double().sum()) for t in local):.10f}\n", end="", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown(0, join_threads=False)  # gloo's teardown can abort a rank that succeeded (fsdp_train.py)
