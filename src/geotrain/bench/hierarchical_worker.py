"""One rank of a hierarchical-vs-flat benchmark row; run under `geotrain emulate` (see bench/hierarchical.py).

    python -m geotrain.bench.hierarchical_worker ROW.json

ROW.json: {"mode": "fp32"|"flat"|"hier", "codec", "codec_params", "error_feedback", "sharded",
"regions": [[ranks]...], "steps", "batch", "seed", "model": GPTConfig fields, "lr", "out": path}.
DDP with one bucket over the tiny GPT; "fp32": DDP's own all-reduce, "flat": geotrain's codec hook
(per-tensor, all ranks), "hier": the hierarchical hook. AdamW (betas 0.9/0.95, weight decay 0.1),
clipping at 1.0, warm-up + cosine schedule; rank r trains on rows [r b, (r+1) b) of each global batch.
A barrier ends every step (the emulated step time is the interval between barriers). Rank 0 writes
{"losses", "val_bpc", "bytes": [[intra, inter] per rank]} to "out".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from geotrain.comm.regions import Regions
from geotrain.data import get_batch, world_tokens
from geotrain.ddp import register_codec_hook
from geotrain.ddp.hierarchical_hook import register_hierarchical_hook
from geotrain.models import GPTConfig, bits_per_char, lr_at, make_model

ONE_BUCKET_MB = 1024.0


def main(path: str) -> None:
    row = json.loads(Path(path).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = GPTConfig(**row["model"])
    model = make_model(config, seed=row["seed"])
    ddp = DistributedDataParallel(model, bucket_cap_mb=ONE_BUCKET_MB)
    state = None
    if row["mode"] == "flat":
        register_codec_hook(ddp, row["codec"], row["error_feedback"], **row["codec_params"])
    elif row["mode"] == "hier":
        state = register_hierarchical_hook(ddp, row["codec"], Regions.of(row["regions"]),
                                           error_feedback=row["error_feedback"], sharded=row["sharded"],
                                           **row["codec_params"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=row["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    data = world_tokens(0)
    generator = torch.Generator().manual_seed(row["seed"] + 1)
    shard = row["batch"] // world
    rows = slice(rank * shard, (rank + 1) * shard)
    losses = []
    dist.barrier()  # the timed steps start here (DDP's initial parameter broadcast is before)
    for step in range(row["steps"]):
        x, y = get_batch(data.train, row["batch"], config.context, generator)
        loss = F.cross_entropy(ddp(x[rows]).flatten(0, 1), y[rows].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, row["steps"], row["lr"])
        optimizer.step()
        losses.append(loss.item())
        dist.barrier()
    sent = [0, 0] if state is None else [state.bytes.intra_bytes, state.bytes.inter_bytes]
    gathered: list[list[int]] = [[0, 0] for _ in range(world)]
    dist.all_gather_object(gathered, sent)
    if rank == 0:
        result = {"losses": losses, "val_bpc": bits_per_char(model, data.val), "bytes": gathered}
        Path(row["out"]).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
