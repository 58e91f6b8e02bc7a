"""A user's own training loop with geotrain's DiLoCo around it: a small MLP, synthetic data, AdamW inside.

Run it under torchrun (real gloo) or under `geotrain emulate` (the same script over emulated links):
    torchrun --standalone --nproc-per-node 2 examples/diloco_train.py --steps 12
    geotrain emulate --cluster seed-geo --devices 0,8 -- examples/diloco_train.py --steps 12
The loop is the ordinary one (zero_grad, backward, step); DiLoCo syncs fragments of the model every
--sync-every steps (cut between tensors, or at equal bytes with --fragment-split bytes) from the inner
optimizer's step hook and, on leaving the `with` block, syncs every
fragment (--sync-moments: each sync also averages AdamW's moments). Rank 0 prints the loss averaged over ranks per step; every rank prints its final
parameters' float64 sum and the bytes it sent (equal on every rank when the replicas agree).
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn

from geotrain.diloco import DiLoCo
from geotrain.procs.exit import exit_without_teardown


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sync-every", type=int, default=4)
    parser.add_argument("--fragments", type=int, default=2)
    parser.add_argument("--fragment-split", choices=("layers", "bytes"), default="layers",
                        help="cut the fragments between tensors, or at equal bytes (splitting tensors)")
    parser.add_argument("--delay", type=int, default=1)
    parser.add_argument("--mix", type=float, default=0.5)
    parser.add_argument("--codec", default="int4-block")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--sync-moments", action="store_true", help="also average AdamW's moments at each sync")
    parser.add_argument("--moment-syncs", type=int, metavar="N",
                        help="--sync-moments: only each fragment's first N syncs carry the moments (default: every sync)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.Tanh(), nn.Linear(args.hidden, args.hidden), nn.Tanh(),
                          nn.Linear(args.hidden, 1))
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(1000 + rank)
    with DiLoCo(model, inner, sync_every=args.sync_every, fragments=args.fragments, delay=args.delay, mix=args.mix,
                codec=args.codec, outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
                sync_moments=args.sync_moments, moment_syncs=args.moment_syncs,
                fragment_split=args.fragment_split) as diloco:
        for step in range(args.steps):
            x = torch.randn(args.batch, 64, generator=data)
            loss = nn.functional.mse_loss(model(x), x[:, :1] * 0.5 - x[:, 1:2])
            inner.zero_grad()
            loss.backward()
            inner.step()
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            if rank == 0:
                print(f"step {step} loss {mean_loss.item() / dist.get_world_size():.8f}", flush=True)
    total = sum(float(p.detach().double().sum()) for p in model.parameters())
    # one write of the whole line, newline included: the ranks share one stdout (see adaptive_diloco.py)
    print(f"rank {rank} final {total!r} bytes {diloco.bytes_sent} declared {diloco.declared_bytes}\n", end="", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13 + gloo: gloo's worker thread can still be releasing the last collective's tensors when the
    # interpreter shuts down, which aborts a rank that succeeded (exit 134). Run the exit handlers, then leave
    # without the shutdown (under `geotrain emulate` too: its report is one of those handlers).
    exit_without_teardown(0, join_threads=False)
