"""What each rank holds, measured at the end of its run, beside what the planner predicts for its device.

Measured per rank (bytes, `rank_memory`, called once after the last step):
  weights    this rank's stage parameters and buffers (a sharded slot: its local shards; tied tensors once)
  gradients  the last step's gradients (set to None only at the next step's start, so still held)
  optimizer  the inner optimizer's state (AdamW's two moments and its step counters)
  sync       every other tensor the DP sync holds (`held_tensors`: a walk, no copy): DiLoCo's anchor and outer
             momentum, error-feedback residuals, exchanges in flight, an asynchronous server's global model
  state      their sum
  device     the part of `state` in the device's memory: weights, gradients, the inner optimizer's state and what the
             sync keeps beside them
  host       the part of `state` in host memory: the sync's tensors on the CPU of a GPU run (the codecs' residuals
             are host copies there in either case), and, with --outer-state host, everything the sync holds (on a CPU
             run, where device and host are one memory, the sync's tensors count where --outer-state puts them)
  peak_rss   the process's peak resident set (getrusage): the interpreter, torch's libraries (about 0.36 GB
             on CPU before any model), activations and buffers in flight included: an upper bound
  peak_device  on a GPU, torch.cuda.max_memory_allocated: the device's peak, what the planner's peak per
             device (state, FSDP's gathered units, activations) is to be compared with; None on CPU
Predicted per stage (`predicted_state_bytes`, geotrain.cost.memory's state term with the run's model as a Job): the
stage's parameters (cost.memory.stage_params: an even split of the layers, the embedding on the first and the last
stage) x (16 bytes per parameter: fp32 weights, gradients and AdamW's two moments here, the same 16 as the
planner's mixed-precision 2 + 2 + 12), with --sync-every + 4 for the fp32 anchor and + 4 for the outer momentum
(none at --outer-momentum 0; cost.memory.OUTER_STATE_BYTES_PER_PARAM counts both), + 4 with a lossy DP codec and
error feedback (cost.memory.OUTER_RESIDUAL_BYTES_PER_PARAM: its fp32 residual; an exact codec keeps none), over K
shards. Activations are not in it (the planner prices them in fp16 for the
job's sequence; here they pass through peak_rss only).
"""

from __future__ import annotations

import collections
import functools
import resource
import sys
import types
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from geotrain.optim.shards import local_shard

MEMORY_KEYS = ("weights", "gradients", "optimizer", "sync", "state", "device", "host", "peak_rss", "peak_device")
"""The measured figures of a rank, in bytes (see the module doc)."""


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    """Every tensor in a nested state (dicts, lists, tuples), depth first."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def tensor_bytes(tensors: Iterable[torch.Tensor], seen: set[int] | None = None) -> int:
    """Bytes of the distinct storages among `tensors` (a DTensor: its local shard), each counted once across calls
    that share `seen`."""
    seen = set() if seen is None else seen
    total = 0
    for tensor in tensors:
        storage = local_shard(tensor).untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def peak_rss_bytes() -> int:
    """This process's peak resident set in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


HELD_BY = ("geotrain.sync.", "geotrain.comm.", "geotrain.optim.", "geotrain.codecs.", "torch.optim.")
"""The modules whose objects `held_tensors` walks into: a DP sync's own machinery (exchanges, reducers, codecs and
their residuals, outer steps, servers, the inner optimizer), not what it points back at (the worker, its data)."""


def held_tensors(root: Any, within: tuple[str, ...] = HELD_BY) -> Iterator[torch.Tensor]:
    """Every tensor reachable from `root` without copying any: through containers (dict keys and values, lists,
    tuples, sets, deques), the attributes of objects whose class is defined in a module of `within`, and the
    closures of functions and bound methods defined there (an exchange in flight holds its tensors in the
    closure that lands it); a leaf tensor's `.grad` too. Each object once."""
    stack, visited = [root], set()
    while stack:
        value = stack.pop()
        if id(value) in visited or value is None or isinstance(value, str | bytes | int | float | bool):
            continue
        visited.add(id(value))
        if isinstance(value, torch.Tensor):
            yield value
            if value.is_leaf and value.grad is not None:
                stack.append(value.grad)
        elif isinstance(value, dict):
            stack.extend([*value.keys(), *value.values()])
        elif isinstance(value, list | tuple | set | frozenset | collections.deque):
            stack.extend(value)
        elif isinstance(value, types.MethodType):
            stack.extend([value.__self__, value.__func__])
        elif isinstance(value, types.FunctionType | functools.partial):
            function = value.func if isinstance(value, functools.partial) else value
            if getattr(function, "__module__", "").startswith(within):
                stack.extend(cell.cell_contents for cell in (function.__closure__ or ()) if _filled(cell))
            if isinstance(value, functools.partial):
                stack.extend([*value.args, *value.keywords.values()])
        elif type(value).__module__.startswith(within):
            stack.extend(vars(value).values() if hasattr(value, "__dict__") else [])
            stack.extend(getattr(value, name) for cls in type(value).__mro__
                         for name in getattr(cls, "__slots__", ()) if hasattr(value, name))


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def rank_memory(stage: torch.nn.Module, sync: Any, device: torch.device,
                outer_state: str = "device") -> dict[str, int | None]:
    """The measured figures of MEMORY_KEYS for a rank holding `stage` on `device` with DP sync `sync` (a
    geotrain.sync GradientSync: its `params`, its inner `optimizer`, and everything else it holds, found by
    `held_tensors` without a copy: a rank at its memory limit can measure itself); `outer_state`: where the sync's
    outer state lives (--outer-state: "device" or "host"), which says where its tensors count on a CPU run."""
    peak = peak_rss_bytes()  # before anything below allocates
    peak_device = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    seen: set[int] = set()
    weights = tensor_bytes(_tensors(stage.state_dict()), seen)
    gradients = tensor_bytes((p.grad for p in sync.params if p.grad is not None), seen)
    optimizer = tensor_bytes(held_tensors(sync.optimizer.state), seen)
    held = list(held_tensors(sync))
    if device.type == "cpu" and outer_state != "host":
        on_host: list[torch.Tensor] = []
    elif device.type == "cpu":
        on_host = held
    else:
        on_host = [t for t in held if local_shard(t).device.type == "cpu"]
    host = tensor_bytes(on_host, seen)
    sync_bytes = host + tensor_bytes(held, seen)
    state = weights + gradients + optimizer + sync_bytes
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer, "sync": sync_bytes, "state": state,
            "device": state - host, "host": host, "peak_rss": peak, "peak_device": peak_device}


def predicted_state_bytes(model_name: str, stages: int, shards: int, outer: bool, momentum: bool, residual: bool,
                          global_batch: int) -> list[float] | None:
    """(S,) the planner's state bytes per device of each stage for the preset `model_name` (None: not a preset),
    K `shards` per slot; `outer`: DiLoCo's anchor too, `momentum`: its outer momentum, `residual`: an error-feedback
    residual (see the module doc)."""
    from geotrain.bench.wan import model_job
    from geotrain.cost.memory import (OUTER_RESIDUAL_BYTES_PER_PARAM, OUTER_STATE_BYTES_PER_PARAM, MemoryConfig,
                                      stage_params)
    from geotrain.models import MODEL_PRESETS

    if model_name not in MODEL_PRESETS:
        return None
    fp32 = OUTER_STATE_BYTES_PER_PARAM / 2  # the anchor, or the momentum
    per_param = (MemoryConfig().state_bytes_per_param + fp32 * (outer + (outer and momentum))
                 + (OUTER_RESIDUAL_BYTES_PER_PARAM if residual else 0.0))
    params = stage_params(model_job(global_batch, model_name), stages)
    return [float(p) * per_param / shards for p in params]


def config_state_bytes(config: Any) -> list[float] | None:
    """predicted_state_bytes for the run of RuntimeConfig `config`: its model, stages and shards, DiLoCo's anchor with
    --sync-every and its momentum where --outer-momentum > 0, and per stage a residual where its DP codec is lossy
    and error feedback is on (geotrain.codecs.Codec.exact: an exact codec keeps none)."""
    optim, comm = config.optim, config.comm
    outer = optim.sync_every is not None
    per_stage = []
    for stage in range(config.stages):
        residual = comm.error_feedback and not comm.stage_dp_codec(stage).build().exact
        predicted = predicted_state_bytes(config.model.model_name, config.stages, config.layout.k, outer,
                                          outer and optim.outer_momentum > 0, residual,
                                          config.schedule.batch_size * config.replicas)
        if predicted is None:
            return None
        per_stage.append(predicted[stage])
    return per_stage


def memory_summary(records: Sequence[dict[str, Any]], predicted: list[float] | None) -> dict[str, Any] | None:
    """{"per_rank": [{rank, stage, replica, shard, MEMORY_KEYS..., predicted_state}], "predicted_state_per_stage",
    "state_error_pct": the largest |measured - predicted| / predicted over ranks} from the records that carry a
    "memory" entry (each rank's last); None when none does."""
    last = {r["rank"]: r for r in records if "memory" in r}
    if not last:
        return None
    rows = []
    for rank in sorted(last):
        record = last[rank]
        row = {"rank": rank, "stage": record["stage"], "replica": record["replica"], "shard": record.get("shard", 0),
               **record["memory"]}
        row["predicted_state"] = None if predicted is None else predicted[record["stage"]]
        rows.append(row)
    errors = [abs(r["state"] - r["predicted_state"]) / r["predicted_state"] * 100 for r in rows
              if r["predicted_state"]]
    return {"per_rank": rows, "predicted_state_per_stage": predicted,
            "state_error_pct": max(errors) if errors else None}
