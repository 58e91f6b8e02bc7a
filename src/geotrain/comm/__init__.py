"""Distributed communication, one implementation for the DDP hooks, the simulated trainer, the
runtime and 1-bit Adam: collectives, reducers, byte ledger, clipping, process launcher.

The reducer protocol. A reducer averages the gradients (or momenta) of ONE data-parallel group:

    reducer = get_reducer("topk:fraction=0.01", ReducerContext.of(named_shapes, world_size))
    means = reducer.reduce(worker_grads, collective, step)
    saved = reducer.state_dict(); reducer.load_state_dict(saved)

- `worker_grads[w][i]`: local worker w's tensor i (the context's named_shapes order); a process of
  a real group holds one local worker, the in-process simulation all of them.
- `collective`: a `Collective` (SimulatedCollective, TorchCollective; the runtime's is timed by its
  transport). Reducers communicate only through it, so its `ledger` counts every byte handed.
- `step`: the training step (seeded codecs agree on their randomness through it).
- returns the group mean of every tensor as the reducer delivers it, the same on every rank.
- `name`: the spec name it was registered under (the codec's name for the codec reducer).
- `whole_model`: True if it must get every tensor in one call (PowerSGD's shared basis, 1 bit);
  False if any subset will do (`reduce(..., names=[...])`, the codec reducer: one DDP bucket).
- `declared_bytes`: what one worker handed, by the reducer's own count (tests hold it to the ledger).
- `state_dict()` / `load_state_dict()`: residuals (error feedback), shared bases, counters.

Reducers: the codec reducer (every codec of geotrain.codecs, error feedback; summable codecs
all-reduce in compressed form, the others all-gather packed payloads), `powersgd` (distributed
PowerSGD), `onebit` (error-compensated 1-bit averaging, 1-bit Adam's momentum). The hierarchical
all-reduce (geotrain.comm.hierarchical: full precision inside regions, a codec between them) spans
several process groups (a region's and the shard owners'), so it is not a one-group reducer: the DDP
hook, the runtime (--dp-hierarchical) and 1-bit Adam (optim.region_collective) use it directly. To add
a one-group reducer: write `factory(params, context) -> reducer` and add one `RegisteredReducer` line
(factory and `ReducerTraits`) to `geotrain.comm.registry.REDUCERS`.
"""

from geotrain.comm.clip import clip_grad_norm_
from geotrain.comm.codec_reducer import CodecReducer
from geotrain.comm.collectives import Collective, SimulatedCollective, TorchCollective
from geotrain.comm.launch import run_workers
from geotrain.comm.ledger import CommLedger, intercept_torch_collectives, tensor_bytes, wire_bytes
from geotrain.comm.onebit import OneBitMomentumReducer
from geotrain.comm.onebit_layout import OneBitLayout
from geotrain.comm.powersgd import PowerSGDConfig, PowerSGDLayout, PowerSGDReducer, compressed_rank
from geotrain.comm.registry import (
    REDUCERS,
    ReducerContext,
    ReducerTraits,
    RegisteredReducer,
    check_reducer_spec,
    get_reducer,
    reducer_traits,
)
from geotrain.procs import WorkerFailure

__all__ = [
    "CodecReducer",
    "Collective",
    "CommLedger",
    "OneBitLayout",
    "OneBitMomentumReducer",
    "PowerSGDConfig",
    "PowerSGDLayout",
    "PowerSGDReducer",
    "REDUCERS",
    "ReducerContext",
    "ReducerTraits",
    "RegisteredReducer",
    "SimulatedCollective",
    "TorchCollective",
    "WorkerFailure",
    "check_reducer_spec",
    "clip_grad_norm_",
    "compressed_rank",
    "get_reducer",
    "intercept_torch_collectives",
    "reducer_traits",
    "run_workers",
    "tensor_bytes",
    "wire_bytes",
]
