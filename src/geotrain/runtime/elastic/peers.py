"""Dead peers of an elastic run: the one place where the launcher says that a replica group's process died and
the groups read it, so that a survivor stops waiting for a member of its quorum that will never come.

torchft's Lighthouse forms a quorum of the groups that asked for one; a group killed after asking is still a
member until its heartbeats time out (--heartbeat-timeout). Its peers then configure the quorum's process group,
whose rendezvous (in the quorum's store) waits for every member: a dead one never comes, and each survivor waited
out --comm-timeout there (120 s by default; a member that dies inside a collective is seen at once instead: its
sockets close with it).

    note_dead(store, group)                                  # the launcher, as it sees the group's process end
    watch_quorums(manager, pg, store, group, rank, timeout_s)  # each process of a group, once its Manager exists

A Manager's replica id is its process's own (torchft appends a uuid to the group's name) and a quorum names its
members' ids, so "a member of this quorum is dead" is exact, whatever the group's restarts. A configuration first
looks at the launcher's dead list (the quorum's store is one member's, maybe a dead one's); then, before the real
rendezvous, every member posts its presence in the quorum's store (the roll call) and waits for the others', and
while one is missing looks at the dead list every `poll_s`: a dead member fails the configuration at once (PeerDied;
torchft reports it, the try does not commit, the group's next quorum forms without the dead one once its heartbeats
time out, or with its restarted process). With no member dead that is one look and one wait for keys that come.
Left open: a member that dies between the roll call and gloo's own rendezvous (milliseconds; the survivors then
wait --comm-timeout there).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

ROLL_CALL_POLL_S = 0.1
"""How often a roll call that still misses a member looks whether a member died (seconds)."""
ROLL_CALL_KEY = "geotrain-roll-call/"
"""Quorum store key prefix under which each member of a quorum posts its presence (its quorum rank after it)."""


class PeerDied(RuntimeError):
    """A member of the quorum being configured died: its process group cannot form (torchft reports it)."""


def replica_key(group: int) -> str:
    """Launcher store key: the torchft replica id of replica group `group`'s running process (group rank 0's)."""
    return f"peers/replica/{group}"


def dead_key(replica_id: str) -> str:
    """Launcher store key: set once the process of torchft replica id `replica_id` is dead."""
    return f"peers/dead/{replica_id}"


def announce(store: Any, group: int, replica_id: str) -> None:
    """Tell the launcher the replica id of replica group `group`'s new process (before its first quorum)."""
    store.set(replica_key(group), replica_id)


def note_dead(store: Any, group: int) -> None:
    """Mark the process replica group `group` announced last as dead (the launcher, before it restarts the group:
    its new process announces its own id). A group that died before announcing was in no quorum: nothing to mark."""
    key = replica_key(group)
    if store.check([key]):
        store.set(dead_key(store.get(key).decode()), "1")


class DeadPeers:
    """The launcher's dead list, read through `store` (a client of the launcher's store)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def first_dead(self, replica_ids: Sequence[str]) -> str | None:
        """The first of `replica_ids` whose process is dead, None when all are alive."""
        return next((r for r in replica_ids if self.store.check([dead_key(r)])), None)


class QuorumMembers:
    """A torchft ManagerClient that keeps the replica ids of the last quorum it returned (`ids`); anything else goes
    to the client it wraps."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.ids: tuple[str, ...] = ()

    @classmethod
    def install(cls, manager: Any) -> QuorumMembers:
        """Wrap `manager`'s client (torchft asks it for every quorum, in its quorum thread, before the configure)."""
        members = cls(manager._client)
        manager._client = members
        return members

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        quorum = self._client._quorum(*args, **kwargs)
        self.ids = tuple(quorum.replica_ids)
        return quorum

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def roll_call(store: Any, rank: int, world_size: int, dead: Callable[[], str | None], timeout_s: float,
              poll_s: float = ROLL_CALL_POLL_S, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> None:
    """Post quorum rank `rank`'s presence in `store` and wait for the other `world_size - 1` members'; PeerDied as
    soon as `dead()` names a dead member (looked at every `poll_s` while one is missing, or the store fails: its
    host may be the dead one), TimeoutError past `timeout_s` (--comm-timeout, as the rendezvous it precedes)."""
    store.set(f"{ROLL_CALL_KEY}{rank}", "1")
    keys = [f"{ROLL_CALL_KEY}{r}" for r in range(world_size) if r != rank]
    started = clock()
    while keys:
        asked = clock()
        try:
            store.wait(keys, timedelta(seconds=poll_s))
            return
        except Exception:  # noqa: BLE001 - the store's timeout (someone is missing) or its host gone
            who = dead()
            if who is not None:
                raise PeerDied(f"quorum member {who} died before the quorum's process group formed") from None
            if clock() - started > timeout_s:
                raise TimeoutError(f"quorum members missing after --comm-timeout {timeout_s:g} s") from None
            sleep(max(0.0, poll_s - (clock() - asked)))  # a store that fails at once is not asked in a spin


class QuorumGuard:
    """What a torchft process group `pg` configures each quorum with (`install`): its members (`members.ids`) are
    looked at first (`first_dead` picks the dead among them: its store may be a dead member's, which a connection
    would wait for until --comm-timeout), then the roll call among them before the group its class builds (looked up
    at each call: the emulating backend may replace it, geotrain.emulate.torchft_groups)."""

    def __init__(self, pg: Any, members: QuorumMembers, first_dead: Callable[[Sequence[str]], str | None],
                 timeout_s: float, poll_s: float = ROLL_CALL_POLL_S) -> None:
        self.pg, self.members, self.first_dead, self.timeout_s, self.poll_s = pg, members, first_dead, timeout_s, poll_s

    def install(self) -> QuorumGuard:
        self.pg.configure, self.pg._create_pg = self.configure, self.create_pg
        return self

    def _check(self, ids: Sequence[str]) -> None:
        who = self.first_dead(ids)
        if who is not None:
            raise PeerDied(f"quorum member {who} died before the quorum's process group formed")

    def configure(self, *args: Any, **kwargs: Any) -> None:
        self._check(self.members.ids)
        type(self.pg).configure(self.pg, *args, **kwargs)

    def create_pg(self, store: Any, rank: int, world_size: int) -> Any:
        ids = self.members.ids
        roll_call(store, rank, world_size, lambda: self.first_dead(ids), self.timeout_s, self.poll_s)
        return type(self.pg)._create_pg(self.pg, store, rank, world_size)


def watch_quorums(manager: Any, pg: Any, store: Any, group: int, rank: int, timeout_s: float) -> QuorumMembers:
    """Make group rank `rank` of replica group `group` (its torchft `manager` over process group `pg`; `store`: the
    launcher's) fail a quorum's configuration at once when a member is dead (the module doc), and (rank 0) announce
    the group's replica id; the members' recorder."""
    from torchft.manager import REPLICA_ID_KEY

    members = QuorumMembers.install(manager)
    QuorumGuard(pg, members, DeadPeers(store).first_dead, timeout_s).install()
    if rank == 0:
        announce(store, group, manager._store.get(REPLICA_ID_KEY).decode())
    return members
