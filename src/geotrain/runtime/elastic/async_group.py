"""One replica group of an elastic asynchronous run (`train --elastic --outer-sync async`, S = 1): a client of
the global model's server, and its host while elected. No torchft collective spans the groups.

Why not torchft: a torchft recovery copies a live peer's state at a synchronous step; asynchronous DiLoCo has
no such step, and every group only talks to the global model's server. So the groups talk over TCP
(geotrain.sync.async_socket), which survives either end's death, and agree on who hosts the server through
the launcher's store (keys under `async/`). Only a closed or refused connection (the host's process is gone) starts
an election; a host that is alive but gives no reply within --comm-timeout ends the waiting group (exit 1: the
launcher restarts it, and it joins the same host), never a second host. The launcher's supervisor restarts a killed group as in every
elastic run (runtime/elastic/launch.py); a restarted group joins as a new client (a request with no gradient
gets it the current model, and it trains on from the run's progress, with a fresh inner AdamW).

The host survives its own loss by re-election from the freshest replica (a standby copy would cost a
second model's traffic per update; every client already holds the last model it received). Every client
keeps that model, its version and update count. Epoch 0's host is group 0. A client that loses the server of
epoch e (HostLost) votes for epoch e + 1 in the store: its copy's (version, updates) (a restarted group with no
copy votes too, without a copy: it counts for the quorum and cannot win). Once max(--min-replicas, R - 1) votes
are in, or the grace window (--heartbeat-timeout seconds: a group that did not vote by then counts as lost) has
passed with at least --min-replicas votes, the first voter to decide writes the winner (highest version; ties:
lowest group) with compare_set, so all read one answer. The winner serves from its copy (OuterServer.start_from:
version, updates and per-client applied counts; the outer momentum restarts from zero: it is not carried in
replies, which would double their size) and publishes its address; the others connect to it and resend the
request the lost server did not answer: a gradient with its old base (its staleness counts against the new
server's version), dropped if the copy already holds it (async_socket). Fewer votes than --min-replicas
within the window end the group with its one line (exit 2).

Lost updates: the model's update count the lost server reached (published in the store after each update)
less the copy's; outer gradients applied after the freshest copy left that no client received. Their own
clients resend those whose reply never came, so what is lost for good is at most that count (the summary's
`lost_updates`, with `elections` and `resent_updates`).

Ending: a group trains while the global model it last received holds fewer than the run's budget of replica
outer gradients (geotrain.sync.async_step.run_budget), then sends its final request; the server replies to the
finals once every connected client has sent its own (a dead client's connection is gone: not waited for), so
every group ends on the same model. The host then marks the run ended in the store and waits for its clients to
close before it exits; a group restarted so late that it finds the server gone and the run ended finishes with
the final model if its join got it, else writes no results (not in the summary's finished groups).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from geotrain.errors import GeotrainError
from geotrain.models import lr_at
from geotrain.observe.observer import open_elastic_observer
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.checkpoint import save_group_checkpoint
from geotrain.runtime.elastic.links import GroupNet
from geotrain.runtime.elastic.stage import GroupPosition, GroupStageModel
from geotrain.runtime.elastic.summary import params_path, summary_path
from geotrain.runtime.training_data import load_training_data
from geotrain.sync.async_merge import outer_optimizer
from geotrain.sync.async_server import OuterServer
from geotrain.sync.async_socket import HostLost, ServerSilent, SocketClient, SocketServer
from geotrain.sync.async_step import progress_steps, run_budget
from geotrain.sync.async_wire import own_store_client
from geotrain.sync.base import ComputeTimer
from geotrain.sync.elastic import QuorumLost
from geotrain.sync.factory import BETAS, WEIGHT_DECAY
from geotrain.cost.async_outer import STALENESS_BOUND

POLL_S = 0.05
"""How often an election looks at the votes (seconds)."""


@dataclass
class HeldModel:
    """The last global model this group received: flat fp32 `model`, its `version`, `updates` and the server's
    per-client `applied` counts (None model: a restarted group that has received none yet)."""

    model: torch.Tensor | None
    version: int = 0
    updates: int = 0
    applied: dict[int, int] = field(default_factory=dict)


def _flat(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in params])


class RunEnded(RuntimeError):
    """The server is gone because the run ended (its host served every final reply and left)."""


class ElectionError(GeotrainError, RuntimeError):
    """Fewer groups than --min-replicas voted for a new host within the grace window."""


class AsyncElasticGroup:
    """Replica group `group` of an elastic asynchronous run (module doc); `store`: the launcher's store;
    `incarnation`: this start of the group (0: the first); `authkey`: the run's (its identity digest: a process of
    another run cannot talk to its server)."""

    def __init__(self, config: RuntimeConfig, group: int, store: Any, net: GroupNet, incarnation: int,
                 authkey: bytes, world: Any = None) -> None:
        self.config, self.group, self.store, self.net, self.incarnation = config, group, store, net, incarnation
        self.data = load_training_data(config.data.data, config.data.data_seed, config.data.val_fraction, world)
        self.seq_len = config.sequence_length
        self.timer = ComputeTimer()
        self.model = GroupStageModel(config, GroupPosition(0), self.data.vocab_size, self.seq_len, self.timer)
        self.params = self.model.params
        self.optimizer = torch.optim.AdamW(self.params, lr=config.optim.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
        self.options = config.sync_options(0)
        self.sync_every: int = config.optim.sync_every  # type: ignore[assignment]
        self.budget = run_budget(config.run.steps, self.sync_every, config.replicas)
        self.authkey = authkey
        self.timeout_s = config.reliability.comm_timeout_s
        # a fresh run's groups all start from the seed's model (version 0); a restarted one holds nothing yet
        self.held = HeldModel(_flat(self.params) if incarnation == 0 else None)
        self.acked = 0
        """This group's outer gradients the server answered."""
        self.epoch = -1
        self.joined = False
        self.client: SocketClient | None = None
        self.host: SocketServer | None = None
        self.observer = open_elastic_observer(config, group, 0, incarnation)
        self.records: list[dict[str, Any]] = []
        self.missed_end = False
        """Restarted after the run ended, before it held the final model: it writes no results."""

    # --- the host -----------------------------------------------------------------------------------------------
    def _serve(self, epoch: int) -> None:
        """Host the global model from this group's copy for `epoch`; publish its address and the lost updates."""
        held, options = self.held, self.options
        assert held.model is not None
        optimizer = outer_optimizer(options.heterogeneity.async_merge, self.config.replicas, options.outer.outer_lr,
                                    options.outer.outer_momentum, options.heterogeneity.async_staleness_power)
        server = OuterServer(held.model, optimizer, [], STALENESS_BOUND, self.budget)
        server.start_from(held.version, held.updates, held.applied)
        store = own_store_client(self.store)
        store.set(f"async/updates/{epoch}", str(held.updates))
        self.host = SocketServer(server, self.net.advertise, self.authkey,
                                 lambda updates: store.set(f"async/updates/{epoch}", str(updates)))
        if epoch > 0:
            previous = f"async/updates/{epoch - 1}"
            reached = int(self.store.get(previous).decode()) if self.store.check([previous]) else held.updates
            self.store.add("async/elections", 1)
            self.store.add("async/lost_updates", max(0, reached - held.updates))
        self.store.set(f"async/address/{epoch}", json.dumps(list(self.host.address)))
        self.store.set("async/epoch", str(epoch))

    # --- elections ----------------------------------------------------------------------------------------------
    def _elect(self, epoch: int) -> int:
        """The group that hosts `epoch` (module doc: votes, quorum, grace window); ElectionError without quorum."""
        key, rel, replicas = f"async/host/{epoch}", self.config.reliability, self.config.replicas
        if not self.store.check([key]):
            held = self.held
            vote = [held.version, held.updates] if held.model is not None else None
            self.store.set(f"async/vote/{epoch}/{self.group}", json.dumps(vote))
            enough = max(rel.min_replicas, replicas - 1)
            deadline = time.monotonic() + rel.heartbeat_timeout_s
            votes = self._votes(epoch)
            while not self.store.check([key]) and len(votes) < enough and time.monotonic() < deadline:
                time.sleep(POLL_S)
                votes = self._votes(epoch)
            candidates = [(v[0], -g) for g, v in votes.items() if v is not None]
            if not self.store.check([key]):
                if len(votes) < rel.min_replicas or not candidates:
                    raise ElectionError(f"replica group {self.group}: {len(votes)} replica groups voted for the global "
                                        f"model's new host within {rel.heartbeat_timeout_s:g} s (--heartbeat-timeout), "
                                        f"fewer than --min-replicas {rel.min_replicas} or none holding a copy")
                self.store.compare_set(key, "", str(-max(candidates)[1]))
        return int(self.store.get(key).decode())

    def _votes(self, epoch: int) -> dict[int, Any]:
        keys = {g: f"async/vote/{epoch}/{g}" for g in range(self.config.replicas)}
        return {g: json.loads(self.store.get(k).decode()) for g, k in keys.items() if self.store.check([k])}

    def _connect(self, epoch: int) -> None:
        """Connect to `epoch`'s host (hosting it if elected); HostLost when it is gone already."""
        self.epoch = epoch
        host = 0 if epoch == 0 else self._elect(epoch)  # epoch 0: group 0 hosts
        if host == self.group and self.held.model is not None:
            self._serve(epoch)
        address_key = f"async/address/{epoch}"
        try:
            self.store.wait([address_key], timedelta(seconds=self.timeout_s))
        except Exception:  # noqa: BLE001 - the store's timeout: the host died before it served
            raise HostLost(f"replica group {host} did not serve epoch {epoch} within {self.timeout_s:g} s") from None
        self.client = SocketClient(tuple(json.loads(self.store.get(address_key).decode())), self.authkey,
                                   self.timeout_s)
        self.joined = False

    def _current_epoch(self) -> int:
        """The epoch to connect to first: 0 at a fresh start; a restarted group's, the last published."""
        if self.incarnation == 0:
            return 0
        self.store.wait(["async/epoch"], timedelta(seconds=self.timeout_s))
        return int(self.store.get("async/epoch").decode())

    def _exchange(self, gradient: torch.Tensor | None, final: bool) -> dict[str, Any]:
        """One request to the server, through host losses and elections; the reply."""
        while True:
            try:
                if self.client is None:
                    self._connect(self.epoch + 1 if self.epoch >= 0 else self._current_epoch())
                assert self.client is not None
                reply = self.client.exchange({"client": self.group, "base": self.held.version, "gradient": gradient,
                                              "final": final, "acked": self.acked, "join": not self.joined})
                self.joined = True
                return reply
            except ServerSilent as exc:  # alive but silent: this group ends (the launcher restarts it), no election
                raise QuorumLost(f"replica group {self.group}: {exc}") from None
            except HostLost:
                if self.client is not None:
                    self.client.close()
                    if gradient is not None:
                        self.store.add("async/resent_updates", 1)
                self.client = None  # the next try connects to the next epoch's host (an election)
                if self.store.check(["async/ended"]):
                    raise RunEnded(f"replica group {self.group}: the run ended") from None

    def _adopt(self, reply: dict[str, Any]) -> None:
        self.held = HeldModel(reply["model"], int(reply["version"]), int(reply["updates"]), dict(reply["applied"]))
        with torch.no_grad():
            offset = 0
            for p in self.params:
                p.copy_(reply["model"][offset:offset + p.numel()].view_as(p).to(p.dtype))
                offset += p.numel()

    # --- training -----------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Train to the run's end; a group restarted so late that the run ended before it got the final model
        writes no results (`missed_end`)."""
        try:
            self._train()
        except RunEnded:
            self.missed_end = self.held.model is None or self.held.updates < self.budget

    def _train(self) -> None:
        cfg, started = self.config, time.monotonic()
        if self.incarnation == 0:
            self._barrier()
        self._adopt(self._exchange(None, False))  # join: the current global model
        self.store.compare_set("t0", "", repr(time.time()))
        if self.incarnation > 0:
            self._note_rejoin(time.monotonic() - started)
        step = progress_steps(self.held.updates, self.sync_every, cfg.replicas)  # a restarted group: the run's place
        period, last = 0, time.perf_counter()
        while self.held.updates < self.budget:
            lr_step = min(cfg.run.steps - 1, progress_steps(self.held.updates, self.sync_every, cfg.replicas))
            record = self._train_step(step, lr_step)
            period += 1
            if period == self.sync_every:
                gradient = self.held.model - _flat(self.params)  # type: ignore[operator]
                exchanged = time.perf_counter()
                self._adopt(self._exchange(gradient, False))
                # the exchange's wall seconds (elections included) and the outer gradient's bytes this group sent
                record.update(comm_s=time.perf_counter() - exchanged, dp_bytes=gradient.numel() * 4)
                self.acked += 1
                period = 0
            record.update(wall_s=time.perf_counter() - last, global_updates=self.held.updates,
                          synced=period == 0)
            last = time.perf_counter()
            self.records.append(record)
            self.observer.step(record)
            step += 1
            self.store.set(f"step/{self.group}", str(step))
        gradient = None if period == 0 else self.held.model - _flat(self.params)  # type: ignore[operator]
        self._adopt(self._exchange(gradient, True))
        assert self.client is not None
        self.client.close()
        if self.host is not None:  # every final reply is out: a group that comes later finds the run ended
            self.store.set("async/ended", "1")
            self.host.wait_closed(self.timeout_s)
            if self.config.checkpoint.checkpoint_dir is not None:  # the end's, once: by the last host
                self.observer.event("checkpoint", cfg.run.steps, **save_group_checkpoint(
                    cfg, self.group, 0, cfg.run.steps, self.model.module, self, self.model.boundaries))

    def settle(self, timer: Any) -> None:
        """Nothing in flight at the end (save_group_checkpoint settles its sync first)."""

    def state_dict(self) -> dict[str, Any]:
        """The end checkpoint's sync state: the inner AdamW and the final global model this group holds (a
        finished asynchronous run: not resumed from, as a non-elastic one's end)."""
        held = self.held
        return {"optimizer": self.optimizer.state_dict(), "finished": True,
                "asynchronous": {"anchor": held.model, "version": held.version, "outer_step": held.updates,
                                 "pushes": self.acked, "inner_steps": len(self.records)}}

    def _train_step(self, step: int, lr_step: int) -> dict[str, Any]:
        cfg = self.config
        self.timer.seconds = 0.0
        x, y = self.data.batch(cfg.data.data_seed, step, self.group, cfg.replicas, cfg.schedule.batch_size,
                               self.seq_len)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(lr_step, cfg.run.steps, cfg.optim.lr)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model.train_step(x, y)
        with self.timer:
            self.optimizer.step()
        return {"step": step, "loss": loss, "batch_sum": int(x.sum()), "samples": int(x.shape[0]),
                "contributors": None, "params_sha256": None, "emulated_s": None, "compute_s": self.timer.seconds,
                "comm_s": 0.0, "dp_bytes": 0, "sent_bytes": None, "inter_region_bytes": None}

    def _barrier(self) -> None:
        """Every group has started once (a fresh run's server must not run ahead of groups still importing)."""
        self.store.set(f"ready/{self.group}/0", "1")
        self.store.wait([f"ready/{g}/0" for g in range(self.config.replicas)], timedelta(seconds=self.timeout_s))

    def _note_rejoin(self, seconds: float) -> None:
        number = self.store.add("rejoins", 1)
        step = progress_steps(self.held.updates, self.sync_every, self.config.replicas)
        self.observer.event("rejoin", step, seconds=seconds)
        self.store.set(f"rejoin/{number}", json.dumps({"group": self.group, "step": step,
                                                       "t": time.time(), "seconds": seconds}))

    def finish(self, result_dir: Path) -> None:
        """Write this group's final parameters and records (read by the launcher; none if it missed the end)."""
        cfg = self.config
        if self.missed_end:
            self.observer.close()
            return
        torch.save(_flat(self.params), params_path(result_dir, self.group, 0))
        val = self.model.validation_loss(self.data.val, self.seq_len, cfg.data.eval_windows, cfg.schedule.batch_size)
        steps = self.records[-1]["step"] + 1 if self.records else 0
        summary = {"group": self.group, "stage": 0, "steps": steps, "val_loss": val, "records": self.records,
                   "failed_quorums": 0}
        path = summary_path(result_dir, self.group, 0)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(summary))
        tmp.replace(path)
        self.observer.close()
