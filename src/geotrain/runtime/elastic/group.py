"""One process of a replica group of an elastic run, on a torchft Manager: the whole group (pipeline
S = 1), or stage s of its S stages (S > 1: one process per stage, failing and restarting together).

A group of S stages is S processes, each with its own torchft Manager: the same replica id (the group),
group rank = stage, group world size = S. Stage 0 hosts the group's own TCPStore (a new one at every
start of the group; its port goes through the launcher's store under the start's number), where its
Manager's server registers and the stages' pipeline group meets (runtime/elastic/stage.py). The
Lighthouse sees one member per group; its quorum, heal decision and `should_commit` are the group's,
agreed by all its stages (torchft's Manager server waits for every group rank), so a stage whose
exchange failed makes the whole group retry. Stage s's DP exchange goes over stage s's Manager (across
groups, stage s to stage s); a recovering group's stage s loads stage s of a healthy peer (torchft's
checkpoint transport fetches per group rank).

A sharded plan (K > 1 devices per slot: runtime/elastic/stage.py) makes a group S x K processes, group rank
s x K + k, one Manager each: the replicate dimension of fault-tolerant HSDP. Position (s, k)'s outer sync goes
between the same position of every group over its Manager's group; FSDP2 inside the group cannot go on without
any of its ranks, so a killed rank takes its whole group out (the launcher restarts it as one), and each
position of the restarted group loads the same position of a live peer.

--device cuda: group rank r of group g computes on GPU (g x S x K + r) mod the GPU count (`group_torch_device`: a
group's processes on GPUs of their own, as NCCL wants), its own groups take comm/groups.group_backend's backends
(runtime/elastic/stage.py own_group_backend: NCCL inside a site), torchft's group gloo for the exchange's host copies
(comm/groups.torchft_backend). Built, never run on a GPU (benchmarks/cuda/check.sh has the rows).

Per step t (blocking DiLoCo: per outer period):
    quorum   manager.start_quorum() before the step's forward (with --sync-every: before the step that
             ends an outer period); a group behind the quorum's newest step (a restarted one) loads a
             live peer's state there (torchft's checkpoint transport: HTTP), step counter included;
    train    forward/backward on this group's slice r of step t's global batch (data seed, t, r); S > 1:
             through the group's pipeline (runtime/elastic/stage.py);
    sync     the gradient (or outer gradient) mean over the quorum's contributing groups
             (geotrain.sync.elastic.ManagerExchange: all-reduce, should_commit, retried on a new
             quorum when a peer died); then the optimizer (and outer) step;
    save     with --checkpoint-dir, when due: the quorum's rank-0 group (runtime/elastic/checkpoint.py).
A group's first quorum is at start-up. The state a peer hands over is cloned when the quorum is
computed, so the sender's next optimizer step cannot change it in flight, and carries the run's
identity: a group built from another model, data or plan is refused by name.

Links (runtime/elastic/links.py): with link emulation or a partition to inject, the Manager's process
groups run on the emulating backend, and (S x K > 1) the group's own groups too (pipeline, FSDP2), each process
on its own device and one emulated clock. A group whose links are cut (a partition: the launcher cuts every
device of the group at once) finds out at its next collective (it raises, as do its peers') or quorum; it then
goes offline: its Managers stop, so its heartbeats stop and the Lighthouse drops it; the others go on with the
smaller quorum. A group of S x K > 1 processes goes offline together: at each quorum its processes take group rank
0's finding (`group_cut_off`), and one that goes offline after a failed quorum tells the others (`offline_key`).
When the launcher heals the links, group rank 0 hosts a new group store, every process starts a new Manager in it
and the group rejoins by live recovery, as a restarted group does, without having lost its processes. Under
--netlab the cut is real (netlab.cuts: every packet between the group's devices and the rest of the lab dropped, the
links between its own devices left up): the group learns of it by failures (its collective times out, its quorum
fails) and by its interface's cut state (as a host would see its site's uplink go); it takes group rank 0's finding at
each quorum over its own links, as above, and waits for the heal offline instead of ending with "no quorum".

Data-position guarantee: step t's global batch is the one of a non-elastic run (offsets a function of
data seed and t); group r always trains on slice r of it. A rejoined group continues at the quorum's
step (never repeating a committed step, never skipping one while it is alive); the slices of a group
that is down are not trained (counted as lost samples in `bench chaos`'s goodput).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from geotrain.comm.groups import torchft_backend
from geotrain.data import WorldTokens
from geotrain.emulate.schedule import inter_region_traffic
from geotrain.observe.observer import open_elastic_observer
from geotrain.errors import GeotrainError
from geotrain.models import lr_at
from geotrain.procs import set_process_name
from geotrain.runtime.batch_shares import share_offset
from geotrain.runtime.checkpoint import identity_digest
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.chaos import has_partition
from geotrain.runtime.elastic.checkpoint import (checkpoint_due, load_group_checkpoint, restore_group_state,
                                                 save_group_checkpoint, writes_checkpoint)
from geotrain.runtime.elastic.late import RunEnded, run_ended, take_final
from geotrain.runtime.elastic.lighthouse import quiet_torchft
from geotrain.runtime.elastic.links import LOCAL_HOST, GroupNet, group_links, process_device
from geotrain.runtime.elastic.peers import watch_quorums
from geotrain.runtime.dp_step import world_max, world_sum_over_replicas
from geotrain.runtime.elastic.stage import (GroupStageModel, group_position, group_size, own_group_backend,
                                           pipeline_group)
from geotrain.runtime.shard_state import local_state, sharded_state
from geotrain.runtime.sharded import shard_rows
from geotrain.runtime.worker import check_gpus_per_rank
from geotrain.optim.shards import is_sharded, local_shard
from geotrain.runtime.elastic.summary import params_path, summary_path
from geotrain.sync.base import ComputeTimer
from geotrain.runtime.training_data import load_training_data
from geotrain.sync.elastic_adaptive import ElasticAdaptiveSync
from geotrain.emulate.install import COMPUTE_CLOCKS
from geotrain.runtime.elastic.periods import run_periods
from geotrain.sync.elastic import (EXCHANGE_RETRIES, ManagerExchange, QuorumLost, StepSuperseded, exchanges_after,
                                   make_elastic_sync)

EXIT_GROUP_ERROR = 2
"""A group's own, non-transient error (bad input, no quorum, refused state): the launcher ends the run
instead of restarting the group."""
OFFLINE_POLL_S = 0.05
"""How often a cut-off group looks whether its links are healed (seconds)."""


class ElasticGroupError(GeotrainError, RuntimeError):
    """A replica group that cannot go on (no quorum, unreachable lighthouse, another run's state)."""


def group_torch_device(config: RuntimeConfig, group: int, rank: int = 0) -> torch.device:
    """Where group rank `rank` of replica group `group` computes: with --device cuda, GPU (group x S x K + rank) mod
    the host's GPU count (a group of one process: GPU group mod the count), so the S x K processes of a group are on
    S x K different GPUs (NCCL inside the group wants a GPU per process: fewer GPUs than S x K is refused in one line)
    while groups may share GPUs (their torchft exchange is host copies on gloo, comm/groups.torchft_backend); else
    the CPU (auto included: an elastic run takes a GPU only when told)."""
    if config.run.device != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ElasticGroupError("device cuda: torch sees no CUDA device here (use --device cpu)")
    size, gpus = group_size(config), torch.cuda.device_count()
    check_gpus_per_rank(size, gpus)
    return torch.device("cuda", (group * size + rank) % gpus)


def run_identity_digest(config: RuntimeConfig) -> str:
    """sha256 of what must match between groups of one run: the numerics' identity and the plan's shape."""
    return identity_digest({**config.identity(), "elastic": True, "min_replicas": config.reliability.min_replicas})


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def params_digest(params: list[torch.nn.Parameter]) -> str:
    """sha256 of the parameters' bytes (equal digests: bit-identical parameters; sharded: this rank's shards)."""
    digest = hashlib.sha256()
    for p in params:
        digest.update(local_shard(p).detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def check_peer_state(state: dict[str, Any], identity: str, group: int) -> None:
    """ElasticGroupError unless a peer's `state` was written by a group of this run (same identity digest)."""
    if state.get("identity") != identity:
        raise ElasticGroupError(f"replica group {group}: refused the state of replica group {state.get('group')}: "
                                f"it belongs to another run (model, data or plan differ)")


@dataclass
class GroupState:
    """The training position of a group: the next step to run, and whether the quorum just started
    handed it a peer's state."""

    step: int = 0
    healed: bool = False
    records: list[dict[str, Any]] = field(default_factory=list)


def incarnation_key(group: int) -> str:
    """Launcher store key: how many times replica group `group` was restarted (absent: 0)."""
    return f"incarnation/{group}"


def offline_key(group: int, incarnation: int) -> str:
    """Launcher store key: how many times start `incarnation` of replica group `group` went offline (a partition;
    set by the first of its processes to go, whose others follow: emulated links only, a lab cut hides the store)."""
    return f"offline/{group}/{incarnation}"


def down_key(group: int) -> str:
    """Launcher store key: set once replica group `group` is down for good (no restart left)."""
    return f"down/{group}"


def group_store_key(group: int, incarnation: int, offlines: int = 0) -> str:
    """Launcher store key of the port of replica group `group`'s own store at its start `incarnation`, a new one
    after each of its `offlines` times offline (a partition: runtime/elastic/chaos.py)."""
    return f"group-store/{group}/{incarnation}/{offlines}"


def open_group_store(config: RuntimeConfig, store: Any, net: GroupNet, group: int, rank: int,
                     incarnation: int, offlines: int = 0) -> Any:
    """Replica group `group`'s own TCPStore for its start `incarnation` (and time offline `offlines`): group rank 0
    hosts a new one and posts its port in the launcher's `store`; the other ranks connect to it at rank 0's address
    (a restarted group's ranks meet in the new one)."""
    from torch.distributed import TCPStore

    timeout = timedelta(seconds=config.reliability.comm_timeout_s)
    key = group_store_key(group, incarnation, offlines)
    if rank == 0:
        own = TCPStore(LOCAL_HOST, 0, None, True, timeout=timeout, wait_for_workers=False)
        store.set(key, str(own.port))
        return own
    try:
        store.wait([key], timeout)
    except Exception:  # noqa: BLE001 - a timeout: one line
        raise ElasticGroupError(f"replica group {group} rank {rank}: its rank 0 did not start within "
                                f"{config.reliability.comm_timeout_s:g} s") from None
    return TCPStore(net.group_host, int(store.get(key).decode()), None, False, timeout=timeout)


class ElasticGroup:
    """Group rank `stage` (its pipeline stage, 0 when S = 1; a sharded plan: stage x K + shard,
    runtime/elastic/stage.py) of replica group `group` of `config` (see the module doc); `store`: the
    launcher's store (barrier, progress, commits, rejoins, link state, the group store's port); `links`: its
    entered TorchftGroups (None: plain gloo); `net`: the addresses it advertises and its lab interface
    (runtime/elastic/links.py)."""

    def __init__(self, config: RuntimeConfig, group: int, store: Any, lighthouse: str,
                 world: WorldTokens | None, links: Any = None, net: GroupNet = GroupNet(), stage: int = 0) -> None:
        self.config, self.group, self.store, self.links, self.net = config, group, store, links, net
        self.position = group_position(config, stage)
        self.rank, self.stage, self.shard = stage, self.position.stage, self.position.shard  # rank: in the group
        self.device = process_device(config, group, stage)  # this process's
        key = incarnation_key(group)
        self.incarnation = int(store.get(key).decode()) if store.check([key]) else 0  # this start of the group
        self.data = load_training_data(config.data.data, config.data.data_seed, config.data.val_fraction, world,
                                       config.data.windows, config.data.epoch_windows)
        self.seq_len = config.sequence_length
        self.offlines = 0  # how many times this start of the group went offline (a partition): its store's number
        self.group_store = self._group_store()
        self.torch_device = group_torch_device(config, group, stage)
        if self.torch_device.type == "cuda":
            torch.cuda.set_device(self.torch_device)  # NCCL's communicators and FSDP2 take the current GPU
        if group_size(config) > 1:
            pipeline_group(self.group_store, self.rank, group_size(config), config.reliability.comm_timeout_s,
                           own_group_backend(config, group, range(group_size(config)), "world",
                                             self.torch_device.type))
        # compute at the group's GPU speed under --emulate-gpu-speed (what adaptive local steps share by), counted
        # by the emulated clock's own clock, as the runtime's workers count it
        scale = config.compute_scale()
        self.timer = ComputeTimer(scale=1.0 if scale is None else scale[self.device],
                                  clock=COMPUTE_CLOCKS[config.emulation.compute_clock] if links is not None
                                  else time.perf_counter)
        self.model = GroupStageModel(config, self.position, self.data.vocab_size, self.seq_len, self.timer, group,
                                     self.torch_device)  # the stage on this process's device, its groups' backends
        self.module, self.params = self.model.module, self.model.params
        self.state = GroupState()
        self.identity = run_identity_digest(config)
        self.lighthouse = lighthouse
        self.ended_late = False  # came back after the launch's last step was committed (runtime/elastic/late.py)
        self.taken: dict[str, Any] | None = None  # then: the summary of the finished peer whose parameters it took
        self.quorum_for = -1  # the step whose quorum this group has started: the next one is for a later step
        self.observer = open_elastic_observer(config, group, self.stage, self.incarnation, self.shard)
        try:
            self.manager = self._manager(lighthouse)
        except Exception as exc:  # noqa: BLE001 - torchft's connection errors: one line
            raise ElasticGroupError(f"replica group {group}: cannot reach the torchft lighthouse {lighthouse}: "
                                    f"{_first_line(exc)}") from None
        outer = config.optim.sync_every is not None
        self.options = options = config.sync_options(self.stage)
        # --batch-shares: this group's windows of each step's global batch; its gradient weighs by them in the
        # quorum's mean (the full-batch gradient over the quorum's windows: runtime/batch_shares.py)
        self.shares = config.batch_shares()
        weight = self.shares[group] / config.schedule.batch_size
        self.exchange = ManagerExchange(self.params, self.manager, lambda: self.state.healed, weight=weight,
                                        weight_on_heal=0.0 if outer else weight, start_quorum=self.quorum,
                                        abort=lambda: self.process_group.abort(), codec=options.exchange.codec,
                                        error_feedback=options.exchange.error_feedback, pg=self.process_group,
                                        hierarchy=self.region_of_group if config.comm.dp_hierarchical else None,
                                        group_world_size=group_size(config))
        # a pipeline stage clips by the whole model's norm: its sum of squares summed over the group's stages
        self.sync = make_elastic_sync(options, self.params, self.exchange,
                                      world_sum_over_replicas(1) if config.stages > 1 else None, group, config.replicas,
                                      world_max if group_size(config) > 1 else None)
        self.sync.listener = self.observer
        self.resumed_from: tuple[int, ...] = ()
        if config.checkpoint.resume:  # every group starts at the checkpoint's step; a restarted one heals past it
            assert config.checkpoint.checkpoint_dir is not None
            self.state.step = restore_group_state(load_group_checkpoint(config, self.stage, self.shard), self.module,
                                                  self.sync, config.checkpoint.checkpoint_dir, self.mesh())
            self.observer.event("resume", self.state.step)
            self.resumed_from = (self.state.step,)  # kept on disk by --keep-checkpoints
        # the step this launch ends at: the run's end, or --stop-after steps after the launch's start (the resumed
        # checkpoint's step, whatever step a restarted group heals to): every group stops there, and the checkpoint
        # written there is the next --resume's
        run, start = config.run, self.resumed_from[0] if self.resumed_from else 0
        self.end = run.steps if run.stop_after is None else min(run.steps, start + run.stop_after)

    def _group_store(self) -> Any:
        return open_group_store(self.config, self.store, self.net, self.group, self.rank, self.incarnation,
                                self.offlines)

    def group_store_key(self) -> str:
        """Launcher store key: the port of this start of the group's store, a new one after each time offline."""
        return group_store_key(self.group, self.incarnation, self.offlines)

    def _manager(self, lighthouse: str) -> Any:
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL

        rel = self.config.reliability
        timeout = timedelta(seconds=rel.comm_timeout_s)
        backend = torchft_backend(self.torch_device.type, len(self.config.cluster.region_names))
        self.process_group = (ProcessGroupGloo if backend == "gloo" else ProcessGroupNCCL)(timeout=timeout)
        manager = Manager(pg=self.process_group, load_state_dict=self._load_state,
                          state_dict=self._state, min_replica_size=rel.min_replicas, use_async_quorum=False,
                          timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout, rank=self.rank,
                          world_size=group_size(self.config), store_addr=self.net.group_host,
                          store_port=self.group_store.port, lighthouse_addr=lighthouse,
                          replica_id=f"geotrain_group_{self.group}", hostname=self.net.advertise,
                          heartbeat_interval=timedelta(seconds=rel.heartbeat_interval_s),
                          checkpoint_transport=advertised_transport(timeout, self.net.advertise), init_sync=False)
        # a quorum member that dies before its process group forms fails the configuration at once
        # (runtime/elastic/peers.py), instead of leaving this group in the rendezvous for --comm-timeout
        watch_quorums(manager, self.process_group, self.store, self.group, self.rank, rel.comm_timeout_s)
        return manager

    def _state(self) -> dict[str, Any]:
        """What a recovering peer loads (cloned now: this group keeps training while it is fetched); the syncs
        in flight settled first (each was committed when posted: nothing to wait for, geotrain.sync.elastic)."""
        self.sync.settle(self.timer)
        # a sharded position's DTensors as plain local shards (runtime/shard_state.py): what the transport carries
        return copy.deepcopy({"identity": self.identity, "group": self.group, "stage": self.stage, "rank": self.rank,
                              "step": self.state.step, "module": local_state(self.module.state_dict()),
                              "sync": local_state(self.sync.state_dict()), "clock_s": self.emulated_s()})

    def _load_state(self, state: dict[str, Any]) -> None:
        check_peer_state(state, self.identity, self.group)
        mesh = self.mesh()
        self.module.load_state_dict(sharded_state(state["module"], mesh))
        self.sync.load_state_dict(sharded_state(state["sync"], mesh))
        self.state.step = int(state["step"])
        self.state.healed = True
        if self.links is not None and state.get("clock_s") is not None:
            self.links.clock.restart(state["clock_s"])  # the run's emulated time, not this process's own

    def region_of_group(self, group: int) -> int:
        """The cluster region of replica group `group`'s process at this one's position (--dp-hierarchical)."""
        device = self.config.layout.devices[self.stage, group, self.shard]
        return int(self.config.cluster.region_of[int(device)])

    def mesh(self) -> Any:
        """The device mesh of this position's FSDP2 shards (the stage's K ranks); None when not sharded."""
        return next((p.device_mesh for p in self.params if is_sharded(p)), None)  # type: ignore[attr-defined]

    def emulated_s(self) -> float | None:
        """This group's emulated clock (seconds since the start-up quorum), None without emulated links."""
        return None if self.links is None else self.links.clock.now()

    def cut_off(self) -> bool:
        """Whether this process goes offline (a partition): the launcher has cut its links (`links_cut`; it cuts
        every device of the group at once), or another process of its group went offline (`offline_key`), so a
        group of S x K > 1 processes drops out, and comes back in one new group store, together."""
        if self.links_cut():
            return True
        if group_size(self.config) == 1 or not self.can_be_cut() or self.net.ifname is not None:
            return False  # in a lab each process sees its own cut (and no offline key: the store is out of reach)
        key = offline_key(self.group, self.incarnation)
        return bool(self.store.check([key])) and int(self.store.get(key)) > self.offlines

    def group_cut_off(self) -> bool:
        """`cut_off` as group rank 0 finds it, the same answer in every process of the group at the same quorum (S x K
        > 1: a broadcast over the group's own links, which a partition leaves up, emulated or in a lab), so that none
        of them asks for a quorum the others left (it would wait out --comm-timeout)."""
        if group_size(self.config) == 1 or not self.can_be_cut():
            return self.cut_off()
        import torch.distributed as dist

        flag = torch.tensor([float(self.rank == 0 and self.cut_off())])
        dist.broadcast(flag, src=0)  # the group's default group (runtime/elastic/stage.py pipeline_group)
        return bool(flag.item())

    def links_cut(self) -> bool:
        """Whether this process's links are cut now: in a lab, its site's links to the others (netlab.cuts); else the
        emulated link state says so."""
        if self.net.ifname is not None:
            from geotrain.netlab.cuts import is_cut

            return is_cut(self.net.ifname)
        return self.links is not None and self.device in self.links.cut_devices()

    def can_be_cut(self) -> bool:
        """Whether --chaos cuts links (a partition) in this run."""
        chaos = self.config.reliability.chaos
        return chaos is not None and has_partition(chaos)

    def offline(self) -> None:
        """Cut off: stop the Manager (no heartbeats: the Lighthouse drops this group), wait for the links
        to heal (group rank 0; the others for its new group store), then start a new Manager in the group's new
        store, whose first quorum recovers the peers' newer state. The group's other processes follow
        (`cut_off`): told before this one's Manager stops, so that a quorum it leaves them in fails into it (in a lab
        each sees its own cut, and the launcher's store is out of reach until the heal)."""
        if group_size(self.config) > 1 and self.net.ifname is None:
            self.store.set(offline_key(self.group, self.incarnation), str(self.offlines + 1))
        self.manager.shutdown(wait=False)
        self.offlines += 1
        while self.links_cut():
            time.sleep(OFFLINE_POLL_S)
        while self.rank != 0 and not self.store.check([self.group_store_key()]):  # rank 0 hosts it once healed
            time.sleep(OFFLINE_POLL_S)
        self.group_store = self._group_store()  # a fresh store: the old one holds the old Manager's address
        self.manager = self._manager(self.lighthouse)
        self.exchange.manager, self.exchange.pg = self.manager, self.process_group

    def quorum(self) -> None:
        """Start this step's quorum (recovering from a peer if behind); one line if none forms in time."""
        self.state.healed = False
        if self.group_cut_off():
            self.offline()
        started = time.monotonic()
        while True:
            try:
                self.manager.start_quorum()
                break
            except ElasticGroupError:
                raise
            except Exception as exc:  # torchft's timeouts and connection errors: one line, not a traceback
                if self.cut_off():  # cut while asking (a real partition): wait for the heal, ask again
                    self.offline()
                    continue
                raise self._no_quorum(exc) from None
        if self.state.healed and self.rank == 0:  # the group rejoins once, whatever its process count
            self._note_rejoin(time.monotonic() - started)
        if not self.state.healed and run_ended(self.store, self.end):  # no live peer: the others finished
            raise RunEnded(f"replica group {self.group}: a quorum after the launch's last step {self.end - 1}")

    def _no_quorum(self, exc: Exception) -> ElasticGroupError:
        rel = self.config.reliability
        return ElasticGroupError(f"replica group {self.group}: no quorum of >= {rel.min_replicas} replica groups "
                                 f"within {rel.comm_timeout_s:g} s (lighthouse {self.lighthouse}): {_first_line(exc)}")

    def _note_rejoin(self, seconds: float) -> None:
        number = self.store.add("rejoins", 1)
        self.observer.event("rejoin", self.state.step, seconds=seconds)
        self.store.set(f"rejoin/{number}", json.dumps({"group": self.group, "step": self.state.step,
                                                       "t": time.time(), "seconds": seconds}))

    def barrier(self) -> None:
        """Wait until every group (every process of it) has started once (a quorum of the first arrivals would
        train without the rest)."""
        self.store.set(f"ready/{self.group}/{self.rank}", "1")
        stages = range(group_size(self.config))
        keys = [f"ready/{g}/{s}" for g in range(self.config.replicas) for s in stages]
        try:
            self.store.wait(keys, timedelta(seconds=self.config.reliability.comm_timeout_s))
        except Exception:  # noqa: BLE001 - a timeout: say who is missing
            missing = [g for g in range(self.config.replicas)
                       if not self.store.check([f"ready/{g}/{s}" for s in stages])]
            raise ElasticGroupError(f"replica group {self.group}: replica groups {missing} did not start within "
                                    f"{self.config.reliability.comm_timeout_s:g} s") from None

    def start(self) -> None:
        """The start-up quorum: a fresh run's groups meet at step 0 and commit it (so that a group
        restarted later is behind and recovers); a restarted group recovers a peer's state here."""
        self.barrier()
        for _ in range(EXCHANGE_RETRIES + 1):
            self.quorum()
            if self.manager.errored() is None:  # e.g. the peer it recovered from died mid-transfer: again
                break
        else:
            raise QuorumLost(f"replica group {self.group}: {EXCHANGE_RETRIES + 1} start-up quorums failed")
        if not self.state.healed:
            self.manager.should_commit()
            if self.links is not None:
                self.links.clock.restart(0.0)  # the groups leave the start-up quorum together: emulated 0
        self.store.compare_set("t0", "", repr(time.time()))
        self.quorum_for = self.state.step

    def due(self, step: int) -> bool:
        """Whether `step` synchronises (every step, the end of an outer period, a fragment's sync)."""
        return exchanges_after(self.options, step)

    def train_step(self, step: int, batch_slice: int | None = None, lr_step: int | None = None) -> dict[str, Any]:
        """One step; the record adds `compute_s` (forward, backward, optimizer: wall seconds), `comm_s` (the
        exchange's all-reduces and commits), `dp_bytes` and, with emulated links, the payload bytes this
        group sent and those between regions (`sent_bytes`, `inter_region_bytes`; None without).
        `batch_slice`: which slice of step `step`'s global batch it trains (None: this group's); `lr_step`: the
        step the learning rate is read at (None: `step`). Adaptive local steps (runtime/elastic/periods.py): an
        inner step, whose record is not `synced` (the period's sync marks it)."""
        cfg = self.config
        self.timer.seconds = 0.0
        comm_before = self.exchange.comm_s
        mark = None if self.links is None else self.links.transfer_mark()
        if batch_slice is None and cfg.schedule.batch_shares != "equal":
            x, y = self.data.share(cfg.data.data_seed, step, share_offset(self.shares, self.group),
                                   self.shares[self.group], sum(self.shares), self.seq_len)
        else:
            x, y = self.data.batch(cfg.data.data_seed, step, self.group if batch_slice is None else batch_slice,
                                   cfg.replicas, cfg.schedule.batch_size, self.seq_len)
        self.sync.set_lr(lr_at(step if lr_step is None else lr_step, cfg.run.steps, cfg.optim.lr))
        self.sync.optimizer.zero_grad(set_to_none=True)
        rows = shard_rows(int(x.shape[0]), self.position.k, self.shard)  # K > 1: this shard's part of the batch
        loss = self.model.train_step(x[rows].to(self.torch_device), y[rows].to(self.torch_device))
        dp_bytes = self.sync.step(step, self.timer).dp_bytes
        synced = self.due(step) and not isinstance(self.sync, ElasticAdaptiveSync)
        sent = None if mark is None else self.links.transfers_since(mark)
        return {"step": step, "loss": loss, "synced": synced, "batch_sum": int(x.sum()), "samples": int(x.shape[0]),
                "contributors": self.exchange.contributors if synced else None,
                "params_sha256": params_digest(self.params) if synced else None, "emulated_s": self.emulated_s(),
                "compute_s": self.timer.seconds, "comm_s": self.exchange.comm_s - comm_before, "dp_bytes": dp_bytes,
                "sent_bytes": None if sent is None else float(sum(t.nbytes for t in sent)),
                "inter_region_bytes": None if sent is None else
                inter_region_traffic(sent, self.config.cluster.region_of)["inter_region_bytes"]}

    def run(self) -> None:
        """Train to the launch's end; `ended_late` True if this group came back after it (runtime/elastic/late.py)."""
        try:
            if isinstance(self.sync, ElasticAdaptiveSync):
                run_periods(self)  # adaptive local steps: the quorum meets at outer-sync indices
            else:
                self._run_steps()
        except RunEnded:
            self.ended_late = True
            self.observer.event("ended_late", self.state.step)

    def take_final(self, result_dir: Path) -> bool:
        """After `run` ended late: a finished peer's final parameters and step (runtime/elastic/late.py); False
        when none finished within --comm-timeout."""
        peer = take_final(self.params, result_dir, self.group, self.rank, self.config.replicas,
                          self.config.reliability.comm_timeout_s)
        if peer is not None:  # its validation loss is of these parameters: not evaluated again
            self.state.step, self.taken = int(peer["steps"]), peer
        return peer is not None

    def _run_steps(self) -> None:
        self.start()
        last = time.perf_counter()
        while self.state.step < self.end:
            step = self.state.step
            if self.due(step) and self.quorum_for != step:
                self.quorum()
                self.quorum_for = self.state.step
                if self.state.step != step:
                    continue  # recovered a newer state: run its step (its quorum is this one)
            try:
                record = self.train_step(step)
            except StepSuperseded:
                self.quorum_for = self.state.step
                continue
            record["wall_s"], last = time.perf_counter() - last, time.perf_counter()  # quorums and retries included
            self.state.records.append(record)
            self.observer.step(record)
            self.state.step = step + 1
            if checkpoint_due(self.config, step + 1, record["synced"], self.end) and \
                    writes_checkpoint(self.manager.participating_rank()):
                self.observer.event("checkpoint", step + 1, **save_group_checkpoint(
                    self.config, self.group, self.rank, step + 1, self.module, self.sync, self.model.boundaries,
                    self.resumed_from))
            if self.rank != 0:
                continue  # rank 0 reports the group's progress and commits (the group's ranks commit together)
            self.store.set(f"step/{self.group}", str(step + 1))
            if record["synced"]:
                self.store.set(f"commit/{step}", json.dumps([record["contributors"], time.time()]))

    def evaluate(self) -> float | None:
        """Mean validation loss (nats) over at most eval_windows held-out windows (on the last stage, else None)."""
        cfg = self.config
        return self.model.validation_loss(self.data.val, self.seq_len, cfg.data.eval_windows, cfg.schedule.batch_size)

    def finish(self, result_dir: Path) -> None:
        """Write this process's final parameters (a sharded plan: its shards) and records (read by the launcher)."""
        flat = torch.cat([local_shard(p).detach().reshape(-1).cpu() for p in self.params])  # the launcher's host
        torch.save(flat, params_path(result_dir, self.group, self.rank))
        summary = {"group": self.group, "stage": self.stage, "rank": self.rank, "steps": self.state.step,
                   # a peer's taken: its loss (None on a stage before the last: its next stage's peer is gone)
                   "val_loss": self.evaluate() if self.taken is None else self.taken["val_loss"],
                   "records": self.state.records,
                   "failed_quorums": self.exchange.failed_quorums}
        path = summary_path(result_dir, self.group, self.rank)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(summary))
        os.replace(tmp, path)
        self.observer.close()


def advertised_transport(timeout: timedelta, host: str) -> Any:
    """torchft's HTTP checkpoint transport, telling its peers `host` (torchft's own says gethostname(),
    which is 127.0.0.1 in a lab namespace and not routable across hosts)."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class AdvertisedHTTPTransport(HTTPTransport):
        def address(self) -> str:
            return f"http://{host}:{self._server.socket.getsockname()[1]}/checkpoint/"

    return AdvertisedHTTPTransport(timeout=timeout, num_chunks=0)


def wait_for_lighthouse(address_file: Path, timeout_s: float) -> str:
    """The lighthouse address the launcher's lighthouse process wrote (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if address_file.is_file() and address_file.read_text().strip():
            return address_file.read_text().strip()
        time.sleep(0.05)
    raise ElasticGroupError(f"the lighthouse did not start within {timeout_s:g} s")


def group_main(config: RuntimeConfig, group: int, result_dir: str, store_port: int, lighthouse: str | None,
               world: WorldTokens | None, net: GroupNet = GroupNet(), stage: int = 0) -> None:
    """Entry point of a replica group's process, group rank `stage` of it (its stage; a sharded plan: stage x K +
    shard) (a supervisor Target): `lighthouse`
    None = read the address the launcher's lighthouse wrote in `result_dir`; `net`: where the launcher's
    store is and what to advertise. Exit status 2 for its own errors (written to error-<group>.txt), 1 for
    anything else (the launcher restarts the group)."""
    from torch.distributed import TCPStore

    position = group_position(config, stage)
    set_process_name(f"geotrain-g{group}" + (f"s{position.stage}" if config.stages > 1 else "") +
                     (f"k{position.shard}" if position.k > 1 else ""))
    log = f"group-{group}.log" if group_size(config) == 1 else f"group-{group}-{stage}.log"
    quiet_torchft(Path(result_dir) / log)
    torch.set_num_threads(config.run.threads)
    worker: Any = None  # an ElasticGroup, or an AsyncElasticGroup (--outer-sync async*)
    try:
        store = TCPStore(net.store_host, store_port, is_master=False,
                         timeout=timedelta(seconds=config.reliability.comm_timeout_s))
        if config.optim.outer_sync != "sync":  # no torchft: the groups are clients of servers (async_group.py)
            from geotrain.runtime.elastic.async_group import AsyncElasticGroup
            from geotrain.runtime.elastic.async_regions import RegionalAsyncGroup

            key = incarnation_key(group)
            incarnation = int(store.get(key).decode()) if store.check([key]) else 0
            kind = AsyncElasticGroup if config.optim.outer_sync == "async" else RegionalAsyncGroup
            worker = kind(config, group, store, net, incarnation, run_identity_digest(config).encode(), world, stage)
            worker.run()
            worker.finish(Path(result_dir))
            os._exit(0)
        address = lighthouse or wait_for_lighthouse(Path(result_dir) / "lighthouse", config.reliability.comm_timeout_s)
        links = group_links(config, group, store, stage)
        with links if links is not None else contextlib.nullcontext():
            worker = ElasticGroup(config, group, store, address, world, links, net, stage)
            worker.run()
            if worker.ended_late and not worker.take_final(Path(result_dir)):
                worker.manager.shutdown(wait=False)
                os._exit(0)  # missed the end, no finished peer's parameters to take: no summary (late.py)
            worker.finish(Path(result_dir))
            worker.manager.shutdown(wait=False)
    except GeotrainError as exc:
        line = str(exc).splitlines()[0][:400] if str(exc) else type(exc).__name__
        (Path(result_dir) / f"error-{group}.txt").write_text(line)
        print(f"geotrain replica group {group}: error: {line}", file=sys.stderr, flush=True)
        _flush_lines(worker)
        os._exit(EXIT_GROUP_ERROR)
    except QuorumLost as exc:  # transient: the launcher restarts this group, which recovers from a peer
        print(f"geotrain replica group {group}: {exc}", file=sys.stderr, flush=True)
        _flush_lines(worker)
        os._exit(1)
    except Exception as exc:  # the launcher restarts the group, and names why in its line (launch._failure_reason)
        line = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        (Path(result_dir) / failure_file(group, stage)).write_text(line)
        raise
    os._exit(0)  # torchft's server threads need no orderly shutdown: the launcher has the results


def failure_file(group: int, stage: int | str) -> str:
    """The file in the run's result directory where process `stage` of replica group `group` writes, in one line,
    the unexpected error it exits with (status 1: the launcher restarts the group); `stage` "*": every process's,
    as a glob pattern."""
    return f"failure-{group}-{stage}.txt"


def _flush_lines(worker: Any) -> None:
    """The step lines `worker`'s observer still buffers, on disk before the process ends (the launcher then
    appends the group's "failure" event, with how it ended)."""
    if worker is not None:
        worker.observer.flush()
