"""Byte accounting of collective calls: what one rank hands to the process group, and what it sends.

Two numbers per call, both in bytes, both per rank:
- `handed`: the size of the input buffer the rank passes to the collective (all_reduce: the tensor;
  all_gather: its own contribution; all_to_all: the whole send buffer, its own chunk included).
  This is measured from the tensors actually passed, and is what codecs declare as payload size.
- `wire`: what the rank puts on the network under the textbook algorithm for that collective:
  ring all-reduce 2 (p-1)/p x B, ring all-gather (p-1) x B, all-to-all (p-1)/p x B (its own chunk
  stays home). A model, not a packet capture: gloo's actual algorithm may differ for tiny tensors.

`CommLedger` is owned by whoever makes the calls (a hook state, a collective); nothing is global.
`intercept_torch_collectives` temporarily wraps `torch.distributed`'s functions so that code we do
not own (torch's built-in DDP hooks) can be measured in the same units.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

COLLECTIVE_OPS = ("all_reduce", "all_gather", "all_to_all")


def wire_bytes(op: str, handed_bytes: int, world_size: int) -> float:
    """Bytes one rank sends for `op` on `handed_bytes` of input among `world_size` ranks (see module doc)."""
    p = world_size
    if p <= 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (p - 1) / p * handed_bytes
    if op == "all_gather":
        return float((p - 1) * handed_bytes)
    if op == "all_to_all":
        return (p - 1) / p * handed_bytes
    raise ValueError(f"unknown collective {op!r}; expected one of {COLLECTIVE_OPS}")


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass
class CommLedger:
    """Counts the collectives one rank (or one simulated worker) makes. `record` once per call."""

    handed_bytes: int = 0
    wire_bytes: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)

    def record(self, op: str, handed_bytes: int, world_size: int) -> None:
        self.wire_bytes += wire_bytes(op, handed_bytes, world_size)
        self.handed_bytes += int(handed_bytes)
        self.calls[op] = self.calls.get(op, 0) + 1

    def reset(self) -> None:
        self.handed_bytes, self.wire_bytes, self.calls = 0, 0.0, {}


def _group_size(args: tuple[Any, ...], kwargs: dict[str, Any], position: int) -> int:
    """World size of the `group` argument, given positionally at `position` or by keyword."""
    import torch.distributed as dist

    group = args[position] if len(args) > position else kwargs.get("group")
    return dist.get_world_size(group)


@contextmanager
def intercept_torch_collectives(ledger: CommLedger) -> Iterator[CommLedger]:
    """Within the block, every `torch.distributed.all_reduce / all_gather / all_gather_single /
    all_to_all_single` call made from Python (e.g. by torch's own DDP hooks) is recorded in `ledger`
    (`all_gather_into_tensor` forwards to `all_gather_single` and is counted once, there).

    It replaces module attributes of `torch.distributed` for the duration of the block, so use it
    only in a process that you own (a benchmark or test worker), never in library code paths.
    Calls made from C++ (DDP's built-in allreduce when no hook is registered) are not seen.
    """
    import torch.distributed as dist

    # torch before 2.13 names the single-tensor all-gather all_gather_into_tensor
    single = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    originals = {name: getattr(dist, name) for name in ("all_reduce", "all_gather", single, "all_to_all_single")}

    # Positional index of `group` after the leading tensor arguments, per torch 2.13's signatures.
    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        ledger.record("all_reduce", tensor_bytes(tensor), _group_size(args, kwargs, 1))
        return originals["all_reduce"](tensor, *args, **kwargs)

    def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        ledger.record("all_gather", tensor_bytes(tensor), _group_size(args, kwargs, 0))
        return originals["all_gather"](tensor_list, tensor, *args, **kwargs)

    def all_gather_single(output: torch.Tensor, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        ledger.record("all_gather", tensor_bytes(tensor), _group_size(args, kwargs, 0))
        return originals[single](output, tensor, *args, **kwargs)

    def all_to_all_single(output: torch.Tensor, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        ledger.record("all_to_all", tensor_bytes(tensor), _group_size(args, kwargs, 2))
        return originals["all_to_all_single"](output, tensor, *args, **kwargs)

    replacements = {"all_reduce": all_reduce, "all_gather": all_gather,
                    single: all_gather_single, "all_to_all_single": all_to_all_single}
    try:
        for name, function in replacements.items():
            setattr(dist, name, function)
        yield ledger
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)
