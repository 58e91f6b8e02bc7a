"""The hierarchical compressed all-reduce (geotrain.comm.hierarchical) as a DDP communication hook.

    regions = Regions.of([[0, 1, 2, 3], [4, 5, 6, 7]])     # global ranks per region
    state = register_hierarchical_hook(ddp_model, "sign", regions)
    ...train as usual...; state.bytes.inter_bytes         # what this rank sent between regions

Each bucket is averaged by one `HierarchicalReducer` (full precision inside regions, the codec with
error feedback between them, sharded over the region's members). The bucket's parameters are the
reducer's segments, so codecs with per-tensor scales (sign, int8) keep one scale per parameter piece.
Error-feedback residuals live in the reducer of a bucket layout (keyed by its parameter names):
DDP's bucket rebuild after the first iteration starts new residuals once; with one bucket
(`bucket_cap_mb` above the model's gradient size) there is no rebuild. Every process of the default
group must call `register_hierarchical_hook` (it creates the hierarchy's process groups).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.codecs import Codec, CodecError, get_codec, parse_flag
from geotrain.comm.hierarchical import HierarchicalGroups, HierarchicalReducer, LinkBytes
from geotrain.comm.regions import Regions, RegionsError, format_regions
from geotrain.ddp.hook_target import require_ddp_model


@dataclass
class HierarchicalHookState:
    """The hook's state: the hierarchy, the codec, one reducer per bucket layout, the step counter."""

    codec: Codec
    groups: HierarchicalGroups
    error_feedback: bool
    intra_dtype: str
    param_names: dict[int, str]
    reducers: dict[tuple[str, ...], HierarchicalReducer] = field(default_factory=dict)
    iteration: int = 0

    @property
    def bytes(self) -> LinkBytes:
        """Bytes this rank sent so far, by link class (all buckets)."""
        total = LinkBytes()
        for reducer in self.reducers.values():
            total.add(reducer.bytes)
        return total


def register_hierarchical_hook(ddp_model: Any, codec: Codec | str, regions: Regions, *, error_feedback: bool = True,
                               intra_dtype: str = "fp32", sharded: bool = True,
                               **codec_params: Any) -> HierarchicalHookState:
    """Make the hierarchical reducer the DDP model's gradient communication (call on every rank,
    before the first backward pass). `codec`: a Codec or a registered name built with `codec_params`;
    `sharded=False`: only each region's first member talks to other regions."""
    import torch.distributed as dist

    module = require_ddp_model(ddp_model, "register_hierarchical_hook")
    if isinstance(codec, str):
        codec = get_codec(codec, **codec_params)
    elif codec_params:
        raise CodecError(f"codec parameters {sorted(codec_params)} given with a Codec instance; pass a name instead")
    if not isinstance(codec, Codec):
        raise CodecError(f"register_hierarchical_hook needs a Codec or a codec name, got {type(codec).__name__}")
    if sorted(regions.ranks) != list(range(dist.get_world_size())):
        raise RegionsError(f"register_hierarchical_hook: regions must hold every rank 0..{dist.get_world_size() - 1} "
                           f"once, got {format_regions(regions)!r:.80}")
    groups = HierarchicalGroups.create(regions, parse_flag(sharded, "register_hierarchical_hook: sharded"))
    state = HierarchicalHookState(codec, groups, parse_flag(error_feedback, "error_feedback"), intra_dtype,
                                  {id(param): name for name, param in module.named_parameters()})
    ddp_model.register_comm_hook(state, hierarchical_hook)
    return state


def hierarchical_hook(state: HierarchicalHookState, bucket):  # type: ignore[no-untyped-def]
    """The DDP hook: average one bucket through the bucket layout's reducer; a completed Future.
    Unannotated on purpose: DDP rejects string annotations (PEP 563)."""
    buffer = bucket.buffer()
    base = buffer.data_ptr()
    entries = sorted(((grad.data_ptr() - base) // buffer.element_size(), state.param_names[id(param)])
                     for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True))
    names = tuple(name for _, name in entries)
    reducer = state.reducers.get(names)
    if reducer is None:
        offsets = [offset for offset, _ in entries] + [buffer.numel()]
        segments = [b - a for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        reducer = HierarchicalReducer(state.codec, state.groups, error_feedback=state.error_feedback,
                                      intra_dtype=state.intra_dtype, segments=segments)
        state.reducers[names] = reducer
    buffer.copy_(reducer.all_reduce_mean(buffer, state.iteration))
    if bucket.is_last():
        state.iteration += 1
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
