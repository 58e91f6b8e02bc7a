"""What a DDP communication hook can be registered on: a `DistributedDataParallel` model, checked once."""

from __future__ import annotations

from typing import Any

import torch

from geotrain.errors import GeotrainError


class HookTargetError(GeotrainError, TypeError):
    """A communication hook was given something that is not a DistributedDataParallel model."""


def require_ddp_model(model: Any, caller: str) -> torch.nn.Module:
    """`model.module` if `model` is a DistributedDataParallel; else HookTargetError saying what to pass."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        kind = type(model).__name__
        hint = (" (wrap it: DistributedDataParallel(model) after torch.distributed.init_process_group)"
                if isinstance(model, torch.nn.Module) else "")
        raise HookTargetError(f"{caller} needs a torch.nn.parallel.DistributedDataParallel model, got {kind}{hint}")
    return model.module
