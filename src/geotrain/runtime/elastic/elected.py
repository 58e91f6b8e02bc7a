"""A client's link to an asynchronous server whose host is elected (elastic `--outer-sync async*`): the global
model's server, or a region's (runtime/elastic/async_regions.py). One tier's keys in the launcher's store sit under
its `prefix` (`async/`: the global model's; `async/region<r>/`: region r's); the counters `async/elections`,
`async/lost_updates` and `async/resent_updates` are the run's, over every tier.

Epoch 0's host is the tier's `first_host`. A client that loses the server of epoch e (HostLost) votes for epoch
e + 1: its copy's (version, updates), or no copy (it counts for the quorum and cannot win, unless the tier is
`seedless` and no vote holds one). Once max(min_votes, electorate - 1) votes are in and one holds a copy, or the
grace window (--heartbeat-timeout seconds) has passed with at least min_votes, the first voter to decide writes the
winner (highest version; ties: the lowest client) with compare_set, so all read one answer; the winner serves from its
copy (the link's `serve` callback) and publishes its address; its server restores the bases of the copy's clients still
alive (live_bases: every reply carries each running client's base and process, (group, incarnation)), so the staleness
bound holds them as the lost server did, and lets one go if the launcher sees its process die before it connects
(watch_restored; the launcher's incarnation and down keys). A voter without a copy whose window passed with no copy
voted does not decide: it waits up to the timeout for a voter with a copy that has not yet seen the loss
(a region server that merges rarely), then ends in one line. A closed or refused connection starts an election; a
host alive but silent for --comm-timeout (ServerSilent) ends the group instead (QuorumLost: the launcher restarts
it), never a second host. A tier may follow another's elections (Tier.follows: positions (s, k) > (0, 0) of groups of
several processes, runtime/elastic/async_group.py Positions): its clients cast no vote and take the leader tier's
winner of the same epoch (its hosts die as whole groups, so the epochs run together); its host publishes its own
address, counting no election.

Emulated links (--time-scale > 0): the host publishes its process's cluster device with its address, and each client
sleeps its request (before it leaves) and the reply (once it came) out on the links between its device and the
host's, x the time scale (runtime/elastic/links.py SocketPacing); a region server's requests to the global model's
host likewise, from its server's thread (which a request in flight holds already). A partition (links.CutHold, any time
scale) holds the request and the reply likewise while either end's device is cut, until the heal; past the timeout
it is ServerSilent (QuorumLost: no election, the host is alive). The host's own client has no timeout: it is held
at the staleness bound behind cut clients until they are back or have given up (their connections close), never
ended itself (the run's freshest copy lives in its process).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

from geotrain.errors import GeotrainError
from geotrain.runtime.elastic.fragment_copy import adopted, fragment_request
from geotrain.runtime.elastic.group import down_key, incarnation_key
from geotrain.runtime.elastic.links import CutHold, SocketPacing
from geotrain.sync.async_socket import HostLost, ServerSilent, SocketClient, SocketServer
from geotrain.sync.async_wire import own_store_client
from geotrain.sync.elastic import QuorumLost

POLL_S = 0.05
"""How often an election looks at the votes (seconds)."""


@dataclass
class HeldModel:
    """The last model a client received from its tier's server: flat fp32 `model`, its `version`, `updates` and
    the server's per-client `applied` counts and `bases` (every running client's base and process, (group,
    incarnation): an elected server restores those alive) (None model: a client that has received none yet). With
    fragments (runtime/elastic/fragment_copy.py): each fragment's `versions` and `counts`, and `applied` and `bases`
    per fragment (lists); `version` and `updates` fragment 0's."""

    model: torch.Tensor | None
    version: int = 0
    updates: int = 0
    applied: dict[int, Any] = field(default_factory=dict)
    bases: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    versions: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)


class RunEnded(RuntimeError):
    """The server is gone because the run ended (its host served every final reply and left)."""


class ElectionError(GeotrainError, RuntimeError):
    """Fewer clients than the quorum voted for a new host within the grace window."""


@dataclass(frozen=True)
class Tier:
    """Who serves one tier: key `prefix`, the client ids that vote (`electorate`), epoch 0's host `first_host`,
    `min_votes` (the quorum), `grace_s` (the election's window), `timeout_s` (a reply's or an address's wait),
    `authkey` (the run's); `seedless`: a voter without a copy may win when no voter holds one (its server starts
    from the tier above: a region's, from the global model)."""

    prefix: str
    electorate: tuple[int, ...]
    first_host: int
    min_votes: int
    grace_s: float
    timeout_s: float
    authkey: bytes
    seedless: bool = False
    follows: str | None = None
    """The prefix of the tier whose elections pick this tier's hosts (None: its own): position (s, k) > (0, 0) of groups
    of several processes follows position (0, 0)'s, so one group hosts every position (module doc: Positions)."""

    @property
    def host_prefix(self) -> str:
        """The prefix under which this tier's elected hosts are written (`host/<epoch>`)."""
        return self.follows or self.prefix


def publish_host(store: Any, tier: Tier, epoch: int, host: SocketServer, device: int = -1) -> None:
    """Make `host` the server of `tier`'s `epoch`: its address, with the cluster `device` of its process (its clients'
    messages take the emulated links to it: SocketPacing; -1: unknown), and the tier's epoch (an election's:
    counted)."""
    if epoch > 0 and tier.follows is None:  # a following tier's election is its leader's: counted there
        store.add("async/elections", 1)
    store.set(f"{tier.prefix}address/{epoch}", json.dumps([*host.address, device]))
    store.set(f"{tier.prefix}epoch", str(epoch))


def serve_counting(store: Any, prefix: str, epoch: int, server: Any, kept: int, host: str, authkey: bytes,
                   at_risk: Callable[[int], int] | None = None,
                   after_update: Callable[[int], None] | None = None) -> SocketServer:
    """Serve `server` (an OuterServer, or one with its interface) on `host` for `prefix`'s `epoch`, publishing after
    each update the replica outer gradients a loss of this host would lose (`at_risk(updates)`; default: the
    model's count), then calling `after_update(updates)` (a checkpoint's writer: runtime/elastic/async_checkpoint.py);
    an elected epoch adds to `async/lost_updates` what its predecessor last published beyond `kept` (the copy's
    count)."""
    risk = at_risk or (lambda updates: updates)
    own = own_store_client(store)  # the server's threads publish: a store client of their own
    store.set(f"{prefix}updates/{epoch}", str(risk(server.updates)))
    if epoch > 0:
        previous = f"{prefix}updates/{epoch - 1}"
        reached = int(store.get(previous).decode()) if store.check([previous]) else kept
        store.add("async/lost_updates", max(0, reached - kept))

    def updated(updates: int) -> None:
        own.set(f"{prefix}updates/{epoch}", str(risk(updates)))
        if after_update is not None:
            after_update(updates)
    return SocketServer(server, host, authkey, updated)


def live_bases(store: Any, tier: Tier, epoch: int, held: HeldModel) -> dict[int, tuple[int, Any]]:
    """The clients' (base, process) an elected server of `tier`'s `epoch` restores from copy `held`: every running
    client's but the lost host's (epoch - 1's: its process is gone) and those whose process the launcher has seen
    die (restarted or down for good: a dead client is not waited for)."""
    lost = tier.first_host if epoch == 1 else int(store.get(f"{tier.host_prefix}host/{epoch - 1}").decode())
    return {c: (b, process) for c, (b, process) in held.bases.items()
            if c != lost and process_alive(store, process)}


def process_alive(store: Any, process: Any) -> bool:
    """Whether `process` ((group, incarnation); None: unknown, not alive) still runs as far as the launcher knows:
    its group not restarted since (runtime/elastic/group.py incarnation_key) nor down for good (down_key)."""
    if process is None:
        return False
    group, incarnation = process
    key = incarnation_key(group)
    now = int(store.get(key).decode()) if store.check([key]) else 0
    return now == incarnation and not store.check([down_key(group)])


def watch_restored(store: Any, host: SocketServer, restored: dict[int, tuple[int, Any]]) -> None:
    """Serve `host` with the `restored` clients' processes; a thread makes each of them whose process dies before
    it connects leave (as a closed connection's client would); it ends once each has connected or left, or the
    host stops."""
    host.processes.update({client: process for client, (_, process) in restored.items()})
    own = own_store_client(store)  # a store client of the thread's own

    def run() -> None:
        pending = {client: process for client, (_, process) in restored.items()}
        while pending and not host.stopping:
            for client, process in list(pending.items()):
                if client in host.connections or client not in host.server.base:
                    del pending[client]  # connected, or gone already
                elif not process_alive(own, process):
                    host.forget(client)
                    del pending[client]
            time.sleep(POLL_S)

    threading.Thread(target=run, name="geotrain-async-restored", daemon=True).start()


def serve_restored(store: Any, tier: Tier, epoch: int, held: HeldModel, server: Any,
                   serve: Callable[[], SocketServer]) -> SocketServer:
    """`server` (an OuterServer) started from copy `held` for `tier`'s `epoch`, with the bases of its live clients
    after an election (live_bases), served by `serve()` and its restored clients watched (watch_restored)."""
    restored = live_bases(store, tier, epoch, held) if epoch > 0 else {}
    bases = {c: base for c, (base, _) in restored.items()}
    if held.versions:  # a FragmentServer: each fragment from its part of the copy (fragment_copy)
        server.start_from(held.versions, held.counts, held.applied, bases)
    else:
        server.start_from(held.version, held.updates, held.applied, bases)
    host = serve()
    watch_restored(store, host, restored)
    return host


def tier_host(store: Any, prefix: str, first_host: int) -> int:
    """The client hosting the tier under `prefix` now: its last published epoch's host (`first_host` before any
    election was published)."""
    epoch = int(store.get(f"{prefix}epoch").decode()) if store.check([f"{prefix}epoch"]) else 0
    return first_host if epoch == 0 else int(store.get(f"{prefix}host/{epoch}").decode())


def elect(store: Any, tier: Tier, epoch: int, voter: int, held: HeldModel) -> int:
    """The client that hosts `tier`'s `epoch` (module doc: votes, quorum, grace window); ElectionError without
    quorum. A following tier's (Tier.follows): its leader's, awaited within the grace window and the timeout."""
    key = f"{tier.host_prefix}host/{epoch}"
    if tier.follows is not None:
        try:
            store.wait([key], timedelta(seconds=tier.grace_s + tier.timeout_s))
        except Exception:  # noqa: BLE001 - the store's timeout: no host decided
            raise ElectionError(f"client {voter}: no host of {tier.follows.rstrip('/')} was elected within "
                                f"{tier.grace_s + tier.timeout_s:g} s for {tier.prefix.rstrip('/')}") from None
    if not store.check([key]):
        vote = [held.version, held.updates] if held.model is not None else None
        store.set(f"{tier.prefix}vote/{epoch}/{voter}", json.dumps(vote))
        enough = max(tier.min_votes, len(tier.electorate) - 1)
        deadline = time.monotonic() + tier.grace_s
        votes = _votes(store, tier, epoch)
        # votes without a copy count for the quorum, but the window stays open for one with a copy
        while not store.check([key]) and (len(votes) < enough or not _copies(votes)) \
                and time.monotonic() < deadline:
            time.sleep(POLL_S)
            votes = _votes(store, tier, epoch)
        candidates = _copies(votes) or ([(-1, -min(votes))] if tier.seedless and votes else [])
        if not store.check([key]) and not candidates and held.model is None:
            _await_decision(store, key, tier)  # a voter with a copy that has not lost its server yet decides
        if not store.check([key]):
            if len(votes) < tier.min_votes or not candidates:
                raise ElectionError(f"client {voter}: {len(votes)} clients voted for a new host of "
                                    f"{tier.prefix.rstrip('/')} within {tier.grace_s:g} s (--heartbeat-timeout), "
                                    f"fewer than --min-replicas {tier.min_votes} or none holding a copy")
            store.compare_set(key, "", str(-max(candidates)[1]))
    return int(store.get(key).decode())


def group_vote(held: HeldModel, versions: Sequence[int] | None) -> HeldModel:
    """What a group votes with: copy `held` (position (0, 0)'s) at the least of its version and the other positions'
    copy `versions` (a host group serves every position from its own copy: the group whose stalest position is
    freshest loses the least); no copy, or `versions` None (a position holds none): none."""
    if versions is None:
        return HeldModel(None)
    if held.model is None or not versions:
        return held
    return dataclasses.replace(held, version=min(held.version, *versions))


def _await_decision(store: Any, key: str, tier: Tier) -> None:
    """Wait for another voter to decide `key`, at most the tier's timeout (then the caller's ElectionError)."""
    try:
        store.wait([key], timedelta(seconds=tier.timeout_s))
    except Exception:  # noqa: BLE001 - the store's timeout: no voter holding a copy decided
        pass


def _copies(votes: dict[int, Any]) -> list[tuple[int, int]]:
    """(version, -client) of every vote that holds a copy: the highest wins (ties: the lowest client)."""
    return [(v[0], -c) for c, v in votes.items() if v is not None]


def _votes(store: Any, tier: Tier, epoch: int) -> dict[int, Any]:
    keys = {c: f"{tier.prefix}vote/{epoch}/{c}" for c in tier.electorate}
    return {c: json.loads(store.get(k).decode()) for c, k in keys.items() if store.check([k])}


class ElectedLink:
    """Client `client`'s link to `tier`'s server (module doc). `held`: its copy; `serve(epoch)`: host the tier
    from `held` and return the SocketServer (called when this client is elected); `fresh`: start at epoch 0 (else
    at the last published). `exchange` adopts every reply into `held`."""

    def __init__(self, store: Any, tier: Tier, client: int, held: HeldModel,
                 serve: Callable[[int], SocketServer], fresh: bool, process: tuple[int, int] | None = None,
                 pacing: SocketPacing | None = None, device: int = -1, cuts: CutHold | None = None,
                 wires: Sequence[range] = ()) -> None:
        self.store, self.tier, self.client, self.held, self.serve, self.fresh = store, tier, client, held, serve, fresh
        self.wires = tuple(wires)
        """Each fragment's range of the model (runtime/elastic/fragment_copy.py); empty: the whole model's server."""
        if self.wires and not held.versions:  # a fresh or resumed copy: every fragment at its version and count
            self.held = dataclasses.replace(held, versions=[held.version] * len(self.wires),
                                            counts=[held.updates] * len(self.wires))
        self.finished: set[int] = set()
        """The fragments whose final push the server acknowledged (fragment_copy)."""
        self.acked_by = [0] * len(self.wires)
        """This client's outer gradients the server answered, per fragment."""
        self.process = process
        """The (group, incarnation) running this client (sent with its join: an elected server restores its base
        while it runs)."""
        self.pacing = pacing
        """This process's emulated links (None: --time-scale 0): each request and reply takes the links between its
        device and the host's, slept here (links.SocketPacing)."""
        self.device = device
        """The cluster device of this process (-1: unknown), published with its address when it hosts."""
        self.cuts = cuts
        """A partition's hold on this process's messages (None: no partition in --chaos; links.CutHold)."""
        self.host_device = -1
        """The cluster device of the current epoch's host (published with its address)."""
        self.acked = 0
        """This client's outer gradients the server answered."""
        self.votes_copy = True
        """Whether this client's copy counts in an election (False: it votes without one, so cannot win; a group of
        several processes until every position of it holds a copy: runtime/elastic/async_group.py)."""
        self.group_versions: Callable[[], list[int] | None] = list
        """The copy versions of the other positions of this client's group (a group of several processes votes with
        its stalest position's: group_vote); none: its own copy's; None: a position holds no copy (no copy voted)."""
        self.epoch = -1
        self.joined = False
        self.connection: SocketClient | None = None
        self.host: SocketServer | None = None
        """The server this client hosts (elected), else None."""

    def _connect(self, epoch: int) -> None:
        """Connect to `epoch`'s host (hosting it if elected); HostLost when it is gone already."""
        self.epoch, tier = epoch, self.tier
        host = tier.first_host if epoch == 0 else elect(self.store, tier, epoch, self.client, group_vote(
            self.held if self.votes_copy else HeldModel(None), self.group_versions()))
        # a restarted epoch-0 host without a copy is a client (it must not serve epoch 0 again)
        if host == self.client and (self.held.model is not None or (tier.seedless and epoch > 0)):
            self.host = self.serve(epoch)
            publish_host(self.store, tier, epoch, self.host, self.device)
        address_key = f"{tier.prefix}address/{epoch}"
        try:
            self.store.wait([address_key], timedelta(seconds=tier.timeout_s))
        except Exception:  # noqa: BLE001 - the store's timeout: the host died before it served
            raise HostLost(f"client {host} did not serve epoch {epoch} within {tier.timeout_s:g} s") from None
        host_name, port, *device = json.loads(self.store.get(address_key).decode())
        self.host_device = device[0] if device else -1
        # the host's own client waits out any hold: its server, in this process, cannot be silent, and a host held at
        # the staleness bound behind cut clients that gave up on it at the timeout would end the run's only copy
        self.connection = SocketClient((host_name, port), tier.authkey, None if self.host is not None else tier.timeout_s)
        self.joined = False

    def _first_epoch(self) -> int:
        if self.fresh:
            return 0
        self.store.wait([f"{self.tier.prefix}epoch"], timedelta(seconds=self.tier.timeout_s))
        return int(self.store.get(f"{self.tier.prefix}epoch").decode())

    def exchange(self, gradient: torch.Tensor | None, final: bool, count: int = 1, fragment: int = 0) -> dict[str, Any]:
        """One request (`count` replica outer gradients in `gradient`; with fragments, `fragment`'s), through host
        losses and elections; the reply (adopted into `held`; a gradient's reply counts in `acked`)."""
        while True:
            try:
                if self.connection is None:
                    self._connect(self.epoch + 1 if self.epoch >= 0 else self._first_epoch())
                assert self.connection is not None
                self._hold()
                self._carry(gradient, out=True)
                place = {"base": self.held.version, "acked": self.acked} if not self.wires else \
                    fragment_request(self.held, len(self.wires), self.finished, self.acked_by)
                reply = self.connection.exchange({"client": self.client, **place, "fragment": fragment,
                                                  "gradient": gradient, "count": count, "final": final,
                                                  "join": not self.joined, "process": self.process})
                self.joined = True
                self._hold()
                self._carry(reply["model"], out=False)
                break
            except ServerSilent as exc:  # alive but silent or cut off: this group ends (restarted), no election
                raise QuorumLost(f"client {self.client} of {self.tier.prefix.rstrip('/')}: {exc}") from None
            except HostLost:
                if self.connection is not None:
                    self.connection.close()
                    if gradient is not None:
                        self.store.add("async/resent_updates", 1)
                self.connection = None  # the next try connects to the next epoch's host (an election)
                if self.store.check([f"{self.tier.prefix}ended"]):
                    raise RunEnded(f"client {self.client}: the run ended") from None
        self.acked += gradient is not None
        if self.wires:
            self.acked_by[fragment] += gradient is not None
            if final and not reply["final"]:  # a final push acknowledged: a header, no values (fragment_copy)
                self.finished.add(fragment)
            else:
                self.held = adopted(self.held, reply, self.wires)
            return reply
        bases = {int(c): (int(b), process) for c, (b, process) in reply.get("bases", {}).items()}
        self.held = HeldModel(reply["model"], int(reply["version"]), int(reply["updates"]), dict(reply["applied"]),
                              bases)
        return reply

    def _hold(self) -> None:
        """Wait while a partition cuts this process's device or the host's (module doc); ServerSilent past the
        timeout."""
        if self.cuts is not None and self.host_device >= 0:
            self.cuts.hold(self.store, self.device, self.host_device)

    def _carry(self, tensor: torch.Tensor | None, out: bool) -> None:
        """Sleep a request carrying `tensor` (`out`) or a reply out on the emulated links to the host (module doc)."""
        if self.pacing is not None and self.host_device >= 0:
            ends = (self.device, self.host_device)
            self.pacing.carry(*(ends if out else ends[::-1]), tensor)

    def close(self) -> None:
        """Close the connection (after the final reply)."""
        if self.connection is not None:
            self.connection.close()

    def end_hosting(self) -> bool:
        """If this client hosts the tier: mark it ended (a client that comes later finds the run ended), wait for
        its clients to close (at most the timeout); whether it hosted."""
        if self.host is None:
            return False
        self.store.set(f"{self.tier.prefix}ended", "1")
        self.host.wait_closed(self.tier.timeout_s)
        return True
