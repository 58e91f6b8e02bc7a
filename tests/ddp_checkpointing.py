"""Shared body of the DDP hook checkpoint tests: train the tiny GPT with a hook, optionally resuming.

Imported inside spawned gloo workers (the tests directory is on their sys.path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from geotrain.models import GPTConfig, make_model

TINY = GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)
MANY_BUCKETS_MB = 0.01  # ~10 kB buckets: the tiny model's 64 kB of gradients spread over several


def train_with_checkpoint(rank: int, steps: int, saved: dict | None, register: Callable[[Any], Any],
                          check_restored: Callable[[Any, dict], None] | None = None) -> dict:
    """AdamW on the tiny GPT through the hook `register(ddp)` installs: many buckets from scratch, one
    bucket when resuming from `saved` (this rank's model, optimizer, hook state and batch generator).
    Returns the losses and everything needed to resume."""
    from torch.nn.parallel import DistributedDataParallel

    model = make_model(TINY, 0)
    ddp = DistributedDataParallel(model, bucket_cap_mb=MANY_BUCKETS_MB if saved is None else 1024.0)
    state = register(ddp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state.load_state_dict(saved["hook"])
        generator.set_state(saved["generator"])
        if check_restored is not None:
            check_restored(state, saved)
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, TINY.vocab_size, (8, 1), generator=generator)
        x = (starts + torch.arange(TINY.context + 1)) % TINY.vocab_size
        x = x[rank * 4:(rank + 1) * 4]
        loss = F.cross_entropy(ddp(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "hook": state.state_dict(), "generator": generator.get_state()}
