"""Checkpoints of an elastic asynchronous run (`train --elastic --outer-sync async|async-hierarchical
--checkpoint-every K`, `--resume`, `--stop-after K`): one copy, written by the global model's current host, in the
format of every elastic checkpoint (runtime/elastic/checkpoint.py: one replica holding the global batch, `latest`,
the manifest).

Steps: an asynchronous run has no common step; a checkpoint is named by the equal schedule's step the global model
reached, as a non-elastic asynchronous run's (geotrain.sync.async_step: step c once the model holds ceil(c x R / H)
replica outer gradients, `pause_updates`). The due steps are the non-elastic run's (CheckpointSection.points).

Who writes: the host's server, right after the update that brings the model's count to a due step's (the largest
such step, if one update crossed several), from its server thread with the server's lock held: the clients'
requests wait for the write (no pause protocol: a client's place is not in the checkpoint). An elected host skips
the steps its predecessor wrote (`async/checkpointed` in the store); it writes a step its predecessor died before
writing at its own first update past it.

What it holds: the global model (as the stage's weights, and flat with the server's state: version, updates,
per-group applied counts, the outer optimizer's momentum and arrivals, the merge rule's reference), marked
`elastic`; with --fragments P every fragment's version, count and outer optimizer (FragmentServer.model_state); with
--sync-moments the flat model is [parameters | v] (the server's buffer: sync/async_moments.py; with fragments as
[parameters | v], not the servers' fragment layout). A resume with another --fragments or --sync-moments setting is
refused in one line (the checkpoint's run identity: runtime/checkpoint.py). Not the groups' inner AdamW states nor
the requests waiting at the server (with `async-hierarchical`: nor the region servers' updates not yet merged into the
global model): a resumed run starts every group as the launcher restarts one (a fresh inner AdamW, the data at the
model's progress), from this model, and every region server from it (runtime/elastic/async_regions.py: a fresh region server's copy of the global model is its
group's).

Positions (S x K > 1: runtime/elastic/async_group.py): each position of the host group writes the shard of its
rank (stage x K + shard: its part of the global model, its server's state; FSDP2 shards as local records,
runtime/shard_state.py, as a synchronous sharded group's) after its own server's update that reaches the step's count,
from its template of the stage's weights (its server's thread never reads the module the group trains: FSDP2 swaps in
unsharded parameters during a forward); the position that finds every shard of the step in writes the manifest (one,
by compare_set: `async/shards/<step>/`), and each position skips the steps its own tier's `checkpointed` key holds, so
a host group lost between its positions' writes leaves the rest to the next host group. `--resume`: each position
loads its own shard.

`--resume` (elastic): every group starts holding the checkpoint's model, version and counts (a copy: it can win an
election); epoch 0's host serves from it with the outer optimizer's state. `--stop-after K`: the run's budget
becomes the count of step start + K (start: the resumed checkpoint's step), the groups end there on one model as at
the run's end, and the host writes the checkpoint of that step. A non-elastic `--resume` from it is refused (one
line, geotrain.sync.async_step): a non-elastic asynchronous rank resumes its own place and rank 0 the server's
clients, which this one copy does not hold.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.checkpoint import fresh_exchange, load_group_checkpoint, save_group_checkpoint
from geotrain.optim.shards import local_shard
from geotrain.runtime.elastic.elected import HeldModel
from geotrain.runtime.shard_state import LOCAL, local_state
from geotrain.sync.async_step import pause_updates, run_budget
from geotrain.sync.async_wire import own_store_client

CHECKPOINTED_KEY = "async/checkpointed"
"""The step of the last checkpoint a host of the global model wrote (an elected host skips it and those before)."""
START_KEY = "async/resumed"
"""The step a resumed launch started at (a group restarted in it reads it: the newest checkpoint may be later)."""


class ServerState:
    """A server's model state as the sync state save_group_checkpoint writes (nothing in flight to settle)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def settle(self, timer: Any) -> None:
        """Nothing in flight: the state was taken with the server's lock held."""

    def state_dict(self) -> dict[str, Any]:
        return {"finished": False, "asynchronous": {"elastic": True, **self.state}}


class Resumed:
    """An elastic asynchronous run's place at its launch: the checkpoint's `step` (0: a fresh run), the model `held`
    (None: the seed's) and the outer optimizer's `optimizer` state."""

    def __init__(self, step: int = 0, held: HeldModel | None = None, optimizer: dict[str, Any] | None = None) -> None:
        self.step, self.held, self.optimizer = step, held, optimizer


def launch_start(config: RuntimeConfig, store: Any, incarnation: int, position: Any = None) -> Resumed:
    """Where this launch started: a fresh run's seed (step 0); `--resume`'s checkpoint for a group's first start
    (load_resumed of its `position`, a GroupPosition, None: (0, 0); its step published in the store), and only its
    step for a restarted group (it joins for the model)."""
    if not config.checkpoint.resume:
        return Resumed()
    if incarnation > 0:
        store.wait([START_KEY], timedelta(seconds=config.reliability.comm_timeout_s))
        return Resumed(int(store.get(START_KEY).decode()))
    resumed = load_resumed(config, position)
    store.compare_set(START_KEY, "", str(resumed.step))
    return resumed


def load_resumed(config: RuntimeConfig, position: Any = None) -> Resumed:
    """`--resume`: the newest checkpoint's step, global model and server state of `position` (a GroupPosition: its
    part of the global model; None: (0, 0)); CheckpointError (one line) when it is not a resumable elastic
    asynchronous checkpoint."""
    state = load_group_checkpoint(config, 0, 0) if position is None else \
        load_group_checkpoint(config, position.stage, position.shard)
    directory, step = config.checkpoint.checkpoint_dir, state["_step"]
    where = ckpt.shard_path(str(directory), step, state["_rank"])
    dp = state["dp"]
    asynchronous = dp.get("asynchronous", {})
    if dp.get("finished"):
        raise ckpt.CheckpointError(f"{where}: the asynchronous run ended in this checkpoint (its final exchange is "
                                   f"done); nothing to resume")
    if not asynchronous.get("elastic") or "model" not in asynchronous:
        raise ckpt.CheckpointError(f"{where}: not an elastic asynchronous run's checkpoint (no global model's server "
                                   f"state); resume it without --elastic")
    # no per-group applied counts: a resumed group's acknowledged count starts at 0, as its server's count of it
    held = HeldModel(asynchronous["model"].to(torch.float32).clone(), int(asynchronous["version"]),
                     int(asynchronous["updates"]), versions=[int(v) for v in asynchronous.get("versions", [])],
                     counts=[int(n) for n in asynchronous.get("counts", [])])
    return Resumed(int(step), held, asynchronous["optimizer"])


def launch_budget(config: RuntimeConfig, start: int) -> tuple[int, int]:
    """(the step this launch stops at, the replica outer gradients the global model takes by then): the run's end
    and budget, or --stop-after K steps after `start` and that step's count (pause_updates)."""
    steps, replicas = config.run.steps, config.replicas
    every: int = config.optim.sync_every  # type: ignore[assignment]
    budget = run_budget(steps, every, replicas)
    stop = steps if config.run.stop_after is None else min(steps, start + config.run.stop_after)
    return stop, budget if stop == steps else min(budget, pause_updates(stop, every, replicas))


class ServerCheckpoints:
    """The checkpoints the host of the global model writes (module doc): group rank `rank` of the `size` processes
    of group `group` (S x K > 1: its position's shard, module doc: Positions), for a launch from step `start` to
    `stop`; `module`: the process's stage (its weights' names and shapes: the global model's values are written in
    their place, the group trains its own meanwhile), `boundaries` its stage's; `protect`: the step resumed from
    (kept on disk)."""

    def __init__(self, config: RuntimeConfig, group: int, module: torch.nn.Module, boundaries: Sequence[int],
                 start: int, stop: int, protect: tuple[int, ...], rank: int = 0, size: int = 1) -> None:
        self.config, self.group, self.boundaries, self.protect = config, group, boundaries, protect
        self.rank, self.size = rank, size
        every, replicas = config.optim.sync_every, config.replicas
        points = config.checkpoint.points(start, stop, config.run.steps) if config.checkpoint.checkpoint_dir else []
        self.points = [(pause_updates(c, every, replicas), c) for c in points]  # type: ignore[arg-type]
        # taken before training: the server's thread must not read the module (FSDP2 swaps in unsharded parameters
        # while the group's thread runs a forward or backward)
        self.module = module
        self.template = local_state(torch.nn.ModuleList([module]).state_dict()) if self.points else {}
        """The stage's weights as a checkpoint holds them (FSDP2 shards as local records: shard_state.py): each write
        puts the global model's values in its parameters' places."""
        self.exchange = fresh_exchange(config, module) if self.points else {}
        named = torch.nn.ModuleList([module]).state_dict(keep_vars=True)
        index = {id(p): i for i, p in enumerate(module.parameters())}
        self.param_of = {key: index[id(value)] for key, value in named.items() if id(value) in index}
        """Each weight's parameter (its place in the flat model: module.parameters()' order; tied names share one)."""
        self.shapes = [local_shard(p).shape for p in module.parameters()]
        """The parameters' local shapes (a sharded slot's: this process's shards)."""
        self.events: list[tuple[int, dict[str, Any]]] = []
        """(step, what its checkpoint event records) of each checkpoint written, for the group's observer."""
        self.failure: str | None = None
        """Why a write failed (the server's thread must not die of it: an OSError there reads as a lost client)."""
        self.lock = threading.Lock()

    def writer(self, store: Any, server: Any, standard: Any = None, prefix: str = "async/") -> Any:
        """The callback a host's SocketServer calls after each update (the lock held): writes the due checkpoint of
        `server` (an OuterServer or a FragmentServer; `standard`: its model as [parameters | v], FragmentLayout's;
        `prefix`: its tier's store keys, each position's own); None when this launch writes none before its end."""
        if not self.points:
            return None
        own = own_store_client(store)  # the server's threads write: a store client of their own
        key = CHECKPOINTED_KEY if prefix == "async/" else f"{prefix}checkpointed"
        done = int(store.get(key).decode()) if store.check([key]) else 0

        def write(updates: int) -> None:
            nonlocal done
            crossed = [c for need, c in self.points if updates >= need and c > done]
            if crossed:
                done = crossed[-1]
                state = server.model_state()
                self.save(done, state if standard is None else {**state, "model": standard(state["model"])},
                          None if self.size == 1 else lambda step: self.last_shard(own, step))
                own.set(key, str(done))
        return write

    def last_shard(self, store: Any, step: int) -> bool:
        """S x K > 1: this position's shard of `step` is written; whether it completes the step's shards and this
        position writes the manifest (the first to see every shard in, by compare_set: one writer). A host group lost
        between its positions' writes leaves the rest to the next host's positions (each skips what its own tier's
        `checkpointed` key says it wrote)."""
        keys = [f"async/shards/{step}/{rank}" for rank in range(self.size)]
        store.set(keys[self.rank], "1")
        return store.check(keys) and \
            store.compare_set(f"async/shards/{step}/manifest", "", str(self.rank)) == str(self.rank).encode()

    def save(self, step: int, state: dict[str, Any], last_shard: Any = None) -> None:
        """Write the checkpoint of `step` from a server's model state (OuterServer.model_state); `last_shard`:
        save_group_checkpoint's (None: one process per group)."""
        with self.lock, torch.no_grad():
            try:
                event = save_group_checkpoint(self.config, self.group, self.rank, step, self.module,
                                              ServerState(state), self.boundaries, self.protect,
                                              self.weights(state["model"]), self.exchange, last_shard)
            except Exception as exc:  # noqa: BLE001 - raised in the group's main thread (take_events)
                self.failure = f"step {step}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                return
            self.events.append((step, event))

    def weights(self, model: torch.Tensor) -> dict[str, Any]:
        """The stage's weights (`template`) holding the flat global `model`'s values (its parameters first)."""
        offsets = [0, *itertools.accumulate(shape.numel() for shape in self.shapes)]
        weights = dict(self.template)
        for key, i in self.param_of.items():
            record = weights[key]
            like = record[LOCAL] if isinstance(record, dict) else record
            values = model[offsets[i]:offsets[i + 1]].view(self.shapes[i]).to(like.dtype).clone()
            weights[key] = {**record, LOCAL: values} if isinstance(record, dict) else values
        return weights

    def take_events(self) -> list[tuple[int, dict[str, Any]]]:
        """The checkpoints written since the last call; CheckpointError (one line) if a write failed."""
        if self.failure is not None:
            raise ckpt.CheckpointError(f"{self.config.checkpoint.checkpoint_dir}: the global model's checkpoint of "
                                       f"{self.failure}"[:400])
        with self.lock:
            events, self.events = self.events, []
        return events
