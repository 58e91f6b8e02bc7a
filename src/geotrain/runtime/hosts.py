"""Several hosts: which plan ranks run on which machine, the rendezvous between them, torchrun commands.

The cluster file names each device's `host` (and optionally its `gpu_index`). Rank s*R + r runs plan
slot (s, r) on device assignment[s][r], so it runs on that device's host. A *node* is one host with
its ranks in ascending order: its i-th process (LOCAL_RANK i) runs plan rank ranks[i] on GPU
gpu_index[i]. Node 0 is the host of rank 0: it hosts the rendezvous store and prints the results;
the others follow in order of their first rank.

Our launcher on each host (`geotrain train --node NAME --rdzv HOST:PORT`) starts that node's ranks; the
node of rank 0 opens a TCPStore on PORT (listening on every interface; HOST must be one of its
addresses), the others connect to HOST:PORT. Each node announces its ranks in the store and checks
that every other node announces the ranks its own plan and cluster give that node (so a host started
with another plan, cluster or node name fails at once, on one line). When a node's workers have all
finished it posts `done/NAME`; node 0 keeps the store open until every node has (bounded wait).

Under torchrun the process ranks are torchrun's (node_rank-major); `plan_rank` maps LOCAL_RANK to the
plan rank, which the worker then uses as its process-group rank (RANK). torchrun's own parser refuses
`--node` after the script (an ambiguous prefix of its --node-rank), so the printed commands name the
node in the environment instead: GEOTRAIN_NODE=NAME (NODE_ENV), read under torchrun like --node.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from geotrain.cluster import Cluster
from geotrain.errors import GeotrainError, shown
from geotrain.runtime.layout import Layout

NODE_ENV = "GEOTRAIN_NODE"
"""Names this host's node for workers started by torchrun (same meaning as --node)."""

ONE_HOST = "localhost"
"""The node name of a plan whose devices name no host: every rank on the one machine."""

DEFAULT_PORT = 29500
"""torchrun's default rendezvous port, used by --print-torchrun when --rdzv is not given."""


class HostsError(GeotrainError, ValueError):
    """A multi-host run is misconfigured: unknown node, a device without a host, nodes that disagree."""


@dataclass(frozen=True)
class Node:
    """One host: its name, the plan ranks it runs (ascending; LOCAL_RANK i runs ranks[i]) and their GPUs."""

    name: str
    ranks: tuple[int, ...]
    gpu_index: tuple[int | None, ...]

    def cuda_visible_devices(self) -> str | None:
        """CUDA_VISIBLE_DEVICES that makes cuda:LOCAL_RANK the GPU of ranks[LOCAL_RANK] (None: no GPU
        index given; a host that gives some must give all)."""
        if all(g is None for g in self.gpu_index):
            return None
        if any(g is None for g in self.gpu_index):
            raise HostsError(f"host {shown(self.name)}: some of its devices give gpu_index and some do not; "
                             f"give it for all or none")
        return ",".join(str(g) for g in self.gpu_index)


@dataclass(frozen=True)
class HostLayout:
    """The nodes of a plan on a cluster; node 0 holds rank 0."""

    nodes: tuple[Node, ...]
    world_size: int

    def node(self, name: str, source: str = "--node") -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(node.name for node in self.nodes)
        raise HostsError(f"{source}: unknown node {shown(name)}: the plan's devices live on {known}")

    def node_rank(self, name: str) -> int:
        return [node.name for node in self.nodes].index(self.node(name).name)


def host_layout(cluster: Cluster, layout: Layout, source: str = "--cluster") -> HostLayout:
    """Group the plan's ranks by the host of their device; a plan none of whose devices names a host
    is one node, ONE_HOST (e.g. --print-torchrun for one machine); HostsError if only some do."""
    by_host: dict[str, list[int]] = {}
    if all(cluster.hosts[layout.slot(rank).device] is None for rank in range(layout.world_size)):
        ranks = tuple(range(layout.world_size))
        return HostLayout((Node(ONE_HOST, ranks, tuple(cluster.gpu_index[layout.slot(r).device] for r in ranks)),),
                          layout.world_size)
    for rank in range(layout.world_size):
        device = layout.slot(rank).device
        host = cluster.hosts[device]
        if host is None:
            missing = sum(cluster.hosts[layout.slot(r).device] is None for r in range(layout.world_size))
            raise HostsError(f"{source}: device {shown(cluster.device_names[device])} (rank {rank}) names no host "
                             f"({missing} of the plan's {layout.world_size} devices lack one); give every device "
                             f"a `host` to run on several hosts")
        by_host.setdefault(host, []).append(rank)
    ordered = sorted(by_host.items(), key=lambda item: item[1][0])  # rank 0's host first
    nodes = tuple(Node(host, tuple(ranks), tuple(cluster.gpu_index[layout.slot(r).device] for r in ranks))
                  for host, ranks in ordered)
    return HostLayout(nodes, layout.world_size)


def parse_endpoint(text: str, source: str = "--rdzv") -> tuple[str, int]:
    """HOST:PORT (IPv6 as [ADDR]:PORT) -> (host, port); HostsError names the option and value."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise HostsError(f"{source}: must be HOST:PORT with a port in 1..65535, got {shown(text)}")
    return host, int(port)


def plan_rank(node: Node, local_rank: int, local_world_size: int, source: str = "torchrun") -> int:
    """The plan rank of this node's LOCAL_RANK; HostsError when torchrun started another number of
    processes on this node than the plan puts there."""
    if local_world_size != len(node.ranks):
        raise HostsError(f"{source}: {local_world_size} processes on node {shown(node.name)} (LOCAL_WORLD_SIZE), but "
                         f"the plan puts {len(node.ranks)} ranks there {list(node.ranks)}: use --nproc-per-node "
                         f"{len(node.ranks)}")
    if not 0 <= local_rank < len(node.ranks):
        raise HostsError(f"{source}: LOCAL_RANK {local_rank} outside 0..{len(node.ranks) - 1} on node {shown(node.name)}")
    return node.ranks[local_rank]


def torchrun_commands(hosts: HostLayout, endpoint: tuple[str, int], train_args: list[str]) -> list[tuple[str, str]]:
    """(node name, shell command) per node: torchrun with a static rendezvous at `endpoint` (the store
    on node 0), running `geotrain train TRAIN_ARGS` with NODE_ENV=NAME; the worker maps LOCAL_RANK to the plan
    rank (`plan_rank`), and CUDA_VISIBLE_DEVICES orders the GPUs when the cluster gives indices."""
    host, port = endpoint
    commands = []
    for node_rank, node in enumerate(hosts.nodes):
        env = node.cuda_visible_devices()
        argv = ["torchrun", f"--nnodes={len(hosts.nodes)}", f"--node-rank={node_rank}",
                f"--nproc-per-node={len(node.ranks)}", f"--master-addr={host}", f"--master-port={port}",
                "-m", "geotrain", "train", *train_args]
        prefix = f"{NODE_ENV}={shlex.quote(node.name)} " + (f"CUDA_VISIBLE_DEVICES={env} " if env is not None else "")
        commands.append((node.name, prefix + shlex.join(argv)))
    return commands


def rendezvous_failure(exc: Exception, rank: int, world_size: int, timeout_s: float) -> HostsError:
    """The one line for torch's failure to form the env:// process group (DistStoreError: workers
    missing at rank 0's store; DistNetworkError: no store at MASTER_ADDR:MASTER_PORT)."""
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    joined = re.search(r"(\d+)/(\d+) clients joined", str(exc))
    if joined:
        missing = world_size - int(joined.group(1))
        return HostsError(f"rendezvous at {where} (MASTER_ADDR:MASTER_PORT): only {joined.group(1)} of {world_size} "
                          f"workers joined within {timeout_s:g} s (--comm-timeout); {missing} missing: start every "
                          f"host's command (see --print-torchrun), each with --nproc-per-node its ranks")
    if rank != 0 and "connect" in str(exc):
        return HostsError(f"rendezvous at {where} (MASTER_ADDR:MASTER_PORT): rank {rank} found no store there within "
                          f"{timeout_s:g} s (--comm-timeout): the host of rank 0 must run first and listen there")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return HostsError(f"rendezvous at {where} (MASTER_ADDR:MASTER_PORT) failed for rank {rank} of {world_size}: {first}")


@dataclass(frozen=True)
class Rendezvous:
    """One node's side of the rendezvous at `addr:port` (node 0 hosts the store)."""

    hosts: HostLayout
    node: str
    addr: str
    port: int
    timeout_s: float = 120.0

    @property
    def is_host(self) -> bool:
        return self.hosts.node_rank(self.node) == 0

    def open_store(self) -> Any:
        """The store (a server on node 0, a client elsewhere), this node announced and checked against
        every other node's announcement. HostsError on a disagreement or a node joining twice."""
        try:
            store = dist.TCPStore(self.addr, self.port, None, self.is_host, timeout=timedelta(seconds=self.timeout_s),
                                  wait_for_workers=False)
        except (RuntimeError, OSError) as exc:  # DistStoreError is a RuntimeError
            role = "host the rendezvous on" if self.is_host else "reach the rendezvous at"
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise HostsError(f"--rdzv: node {shown(self.node)} could not {role} {self.addr}:{self.port}: {first}") from None
        self._announce(store)
        return store

    def _announce(self, store: Any) -> None:
        mine = self.hosts.node(self.node)
        if store.add(f"hosts/joined/{self.node}", 1) > 1:
            raise HostsError(f"--node: node {shown(self.node)} joined the rendezvous twice (another host uses this name)")
        store.set(f"hosts/ranks/{self.node}", json.dumps(list(mine.ranks)))
        problem = None
        for node in self.hosts.nodes:
            try:
                store.wait([f"hosts/ranks/{node.name}"], timedelta(seconds=self.timeout_s))
                theirs = json.loads(store.get(f"hosts/ranks/{node.name}").decode())
            except RuntimeError:  # a timeout, or the store host went away
                raise HostsError(f"--rdzv: node {shown(node.name)} did not join {self.addr}:{self.port} within "
                                 f"{self.timeout_s:g} s (start `geotrain train --node {node.name}` there)") from None
            if theirs != list(node.ranks) and problem is None:
                problem = (f"--node: node {shown(node.name)} runs ranks {theirs}, but this node's plan and cluster "
                           f"put ranks {list(node.ranks)} there: use the same --plan and --cluster on every host")
        # node 0 keeps the store up until every node has read every announcement, so that each can
        # name the disagreement itself instead of losing the store
        checked = store.add("hosts/checked", 1)
        deadline = time.monotonic() + self.timeout_s
        while self.is_host and checked < len(self.hosts.nodes) and time.monotonic() < deadline:
            time.sleep(0.05)
            checked = store.add("hosts/checked", 0)
        if problem is not None:
            raise HostsError(problem)

    def finish(self, store: Any, poll_s: float = 0.05) -> None:
        """Post that this node's workers all ended well; node 0 then waits (bounded) for the others,
        so that its store outlives every worker that may still talk to it."""
        store.set(f"hosts/done/{self.node}", "1")
        if not self.is_host:
            return
        deadline = time.monotonic() + self.timeout_s
        keys = [f"hosts/done/{node.name}" for node in self.hosts.nodes]
        while time.monotonic() < deadline and not store.check(keys):
            time.sleep(poll_s)
