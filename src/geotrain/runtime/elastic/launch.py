"""Launch an elastic run: a torchft Lighthouse and R replica groups, all supervised by one Supervisor
(geotrain.procs: they end with the launcher, SIGKILL included), and keep it going through failures.

    summary = launch_elastic(config)          # config.reliability.elastic

Supervisor rank 0 is the lighthouse (unless --lighthouse names a running one, or --outer-sync async*, whose groups
use no torchft: runtime/elastic/async_group.py), ranks 1 + r S .. r S + S
are replica group r's S stage processes (runtime/elastic/group.py; S = 1: one; a sharded plan: S x K, ranks
1 + r S K .. in group-rank order), then the spares (runtime/elastic/spares.py: groups of one process, no
--netlab). A group is the unit: the watch loop polls every rank and judges each group by its stages' exits:
  - a group that fails (a stage killed or crashed) is marked dead for its peers (runtime/elastic/peers.py: one
    waiting for it in a quorum stops at once) and restarted as a whole (every stage stopped and
    started again, `Supervisor.restart`, counted once; S = 1: in a waiting spare, its old slot then starting the
    next spare) up to --max-restarts times and recovers from a live peer; the others never stop (they go on with
    the smaller quorum);
  - a group that exits with its own error (status 2: no quorum, unreachable lighthouse, refused state)
    ends the run with its one line, as does a lost lighthouse or every group down;
  - once a group has finished, no group is restarted; the others get `finish_grace_s` to finish.
--chaos kills are SIGKILLs of a group's tree at the seeded times (runtime/elastic/chaos.py); partitions
cut a group's links in the link state the groups' emulating backend (asynchronous groups: their messages' CutHold)
reads (runtime/elastic/links.py), or under --netlab the lab's links between its devices and the other sites
(runtime/elastic/hosts.py), and heal them `for` seconds later (a group still cut when the first group finishes missed
the end: stopped).
"""

from __future__ import annotations

import contextlib
import json
import socket
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from geotrain.errors import GeotrainError
from geotrain.observe.observer import launcher_event
from geotrain.procs import Supervisor, describe_exit, forkserver_context
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.launcher import check_before_launch
from geotrain.runtime.elastic.chaos import (Cut, Kill, cut_heal_s, kill_schedule, parse_chaos,
                                            partition_schedule)
from geotrain.runtime.elastic.group import EXIT_GROUP_ERROR, down_key, failure_file, group_main, incarnation_key
from geotrain.runtime.elastic.hosts import LocalHosts, group_hosts
from geotrain.runtime.elastic.lighthouse import LighthouseSettings, join_timeout_s, lighthouse_main
from geotrain.runtime.elastic.peers import note_dead
from geotrain.runtime.elastic.spares import spare_count, spare_key, spare_main
from geotrain.runtime.elastic.stage import group_position, group_size
from geotrain.runtime.elastic.summary import (FINAL_KEY, ElasticSummary, max_stage_param_diff, mean_losses,
                                              read_groups, stall_seconds)

ProgressCallback = Callable[[int, int], None]
EventCallback = Callable[[str], None]
"""Called with one line per failure, kill, partition, heal and rejoin as it happens, naming the group's site."""
FINISH_GRACE_S = 30.0
"""Seconds the other groups get to finish after the first group finished (they commit the same last step)."""


class ElasticRunError(GeotrainError, RuntimeError):
    """An elastic run that could not finish (one line: which group or process, and why)."""


def require_torchft() -> None:
    try:
        import torchft  # noqa: F401
    except ImportError as exc:
        raise ElasticRunError(f"--elastic needs torchft (pip install 'geotrain[ft]'): {exc}") from None


def check_reachable(endpoint: str, timeout_s: float) -> None:
    """ElasticRunError (one line) unless a TCP connection to HOST:PORT `endpoint` opens within `timeout_s`
    (checked before any process starts: an unreachable lighthouse fails fast)."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ElasticRunError(f"--lighthouse must be HOST:PORT, got {endpoint!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ElasticRunError(f"cannot reach the torchft lighthouse at {endpoint} within {timeout_s:g} s: "
                              f"{exc.strerror or exc}") from None


def group_code(codes: tuple[int | None, ...] | list[int | None], ranks: list[int]) -> int | None:
    """A replica group's exit from its stages' (`ranks`): a signal's status when a stage was killed (its
    siblings' own errors follow from it: a stage 1 loses its group's torchft server with its stage 0, and
    exits with "no quorum" before the launcher sees the kill), else EXIT_GROUP_ERROR when a stage ended with
    its own error, else the first failed stage's status, else 0 when every stage finished, else None."""
    mine = [codes[r] for r in ranks]
    killed = [code for code in mine if code is not None and code < 0]
    if killed:
        return killed[0]
    if EXIT_GROUP_ERROR in mine:
        return EXIT_GROUP_ERROR
    failed = [code for code in mine if code not in (None, 0)]
    if failed:
        return failed[0]
    return None if None in mine else 0


@dataclass
class _Watch:
    """The launcher's bookkeeping of one run (`size`: the processes of a group, S x K; `first`: the supervisor
    rank of group 0's rank 0)."""

    groups: int
    size: int = 1
    first: int = 1
    restarts: list[int] = field(default_factory=list)
    failures: int = 0
    kills: int = 0
    failed_at: dict[int, list[float]] = field(default_factory=dict)
    ever_failed: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)
    down: set[int] = field(default_factory=set)
    first_done_at: float | None = None
    cut: dict[int, float] = field(default_factory=dict)  # group -> when its links heal (chaos seconds)
    healed_at: dict[int, list[float]] = field(default_factory=dict)  # group -> unix times of its heals
    partitions: int = 0
    sites: tuple[str, ...] = ()  # each group's site: the region of its stage-0 device
    on_event: EventCallback | None = None
    rejoins_seen: int = 0
    slots: dict[int, int] = field(default_factory=dict)  # group -> the supervisor rank now running it (S = 1)
    spares: list[int] = field(default_factory=list)  # supervisor ranks of the spares waiting for a group
    spare_spec: Callable[[int], Any] | None = None  # a spare's spec, by its supervisor rank

    def say(self, group: int, what: str) -> None:
        if self.on_event is not None:
            site = f" ({self.sites[group]})" if group < len(self.sites) else ""
            self.on_event(f"replica group {group}{site} {what}")

    def ranks(self, group: int) -> list[int]:
        """The supervisor ranks of `group`'s processes."""
        if group in self.slots:
            return [self.slots[group]]
        return [self.first + group * self.size + s for s in range(self.size)]

    def restart(self, supervisor: Supervisor, store: Any, group: int) -> None:
        """Start `group` again: in a waiting spare (its old slot then starts a new spare), else anew."""
        if not self.spares or self.spare_spec is None:
            supervisor.restart(self.ranks(group))
            return
        spare, (old,) = self.spares.pop(0), self.ranks(group)
        store.set(spare_key(spare), str(group))
        self.slots[group] = spare
        with contextlib.suppress(Exception):  # absent unless the old slot once held a spare
            store.delete_key(spare_key(old))
        supervisor.restart([old], self.spare_spec(old))
        self.spares.append(old)


def launch_elastic(config: RuntimeConfig, progress: ProgressCallback | None = None, tokens: Any = None,
                   poll_s: float = 0.05, on_event: EventCallback | None = None) -> ElasticSummary:
    """Run `config` (elastic) to the end on this machine (in a netlab with --netlab); ElasticRunError (one
    line) when it cannot. A checkpoint directory is checked first, as a non-elastic run's (a resumed
    checkpoint complete, of this run and intact), and held (locked) for the run's life. `on_event` gets a
    line per failure, chaos kill, partition, heal and rejoin as it happens."""
    require_torchft()
    with check_before_launch(config):
        return _launch_checked(config, progress, tokens, poll_s, on_event)


def group_sites(config: RuntimeConfig) -> tuple[str, ...]:
    """Each replica group's site: the region of the device that runs its stage 0."""
    return tuple(config.cluster.site_of(d) for d in config.assignment[0])


def _launch_checked(config: RuntimeConfig, progress: ProgressCallback | None, tokens: Any,
                    poll_s: float, on_event: EventCallback | None = None) -> ElasticSummary:
    from geotrain.comm.launch import FORKSERVER_PRELOAD

    started = time.perf_counter()
    rel, groups = config.reliability, config.replicas
    if rel.lighthouse is not None:
        check_reachable(rel.lighthouse, rel.comm_timeout_s)
    hosts = group_hosts(config)  # a lab that cannot be built fails here, before any process starts
    # torchft and the group's modules imported once by the fork server (when this launcher starts it):
    # a restarted group then rejoins without seconds of imports
    asynchronous = config.optim.outer_sync != "sync"
    context = forkserver_context([*FORKSERVER_PRELOAD, *(["geotrain.runtime.elastic.async_regions"] if asynchronous
                                                         else ["torchft"]), "geotrain.runtime.elastic.group"])
    if tokens is None and config.data.data is None:
        from geotrain.data import world_tokens

        tokens = world_tokens(config.data.data_seed)
    with hosts, tempfile.TemporaryDirectory(prefix="geotrain-elastic-") as tmp:
        store = hosts.store(timedelta(seconds=30))
        lighthouse = rel.lighthouse and f"http://{rel.lighthouse}"
        specs = [hosts.target(context, g, group_main,
                              (config, g, tmp, store.port, lighthouse, tokens, hosts.net(g, s), s),
                              f"geotrain-group-{g}" + (f"-rank-{s}" if group_size(config) > 1 else ""), s)
                 for g in range(groups) for s in range(group_size(config))]
        needs_lighthouse = rel.lighthouse is None and not asynchronous
        if needs_lighthouse:
            settings = LighthouseSettings(f"{hosts.control}:0", rel.min_replicas,
                                          join_timeout_s=join_timeout_s(rel.comm_timeout_s),
                                          heartbeat_timeout_s=rel.heartbeat_timeout_s)
            address_file = str(Path(tmp) / "lighthouse")
            specs.insert(0, hosts.target(context, None, lighthouse_main, (settings, address_file, hosts.control),
                                         "geotrain-lighthouse"))
        first_group = 1 if needs_lighthouse else 0
        spares = range(len(specs), len(specs) + spare_count(config))  # after the lighthouse and the groups

        def spare_spec(rank: int) -> Any:
            return hosts.target(context, None, spare_main, (config, tmp, store.port, lighthouse, tokens, rank),
                                "geotrain-spare")

        specs += [spare_spec(rank) for rank in spares]
        faults = parse_chaos(rel.chaos) if rel.chaos else ()
        kills = kill_schedule(faults, groups, config.run.seed)
        cuts = partition_schedule(faults, groups, config.run.seed)
        watch = _Watch(groups, group_size(config), first_group, [0] * groups, sites=group_sites(config),
                       on_event=on_event, spares=list(spares), spare_spec=spare_spec)
        with Supervisor(specs, grace_s=0.0, term_s=0.0, poll_s=poll_s, cleanup_paths=[Path(tmp)]) as supervisor:
            _watch(supervisor, config, watch, (kills, cuts), Path(tmp), (store, hosts), progress, poll_s)
        return _summary(config, watch, Path(tmp), store, time.perf_counter() - started)


def _watch(supervisor: Supervisor, config: RuntimeConfig, watch: _Watch,
           chaos: tuple[list[Kill], list[Cut]], result_dir: Path, links: tuple[Any, LocalHosts],
           progress: ProgressCallback | None, poll_s: float) -> None:
    """Poll until every group has finished or is down for good; restart failed groups; run the chaos.
    `links`: the launcher's store and the hosts that cut links."""
    rel, store = config.reliability, links[0]
    pending, cuts = list(chaos[0]), list(chaos[1])
    last_progress = -1
    while True:
        codes = supervisor.poll()
        now = time.monotonic()
        watch.spares = [rank for rank in watch.spares if codes[rank] is None]  # a spare that died is not used
        if watch.first and codes[0] is not None:
            raise ElasticRunError(f"the torchft lighthouse {describe_exit(codes[0])}")
        for g in range(watch.groups):
            code = group_code(codes, watch.ranks(g))
            if code is None or g in watch.done or g in watch.down:
                continue
            if code == 0:
                watch.done.add(g)
                watch.first_done_at = watch.first_done_at or now
            elif code == EXIT_GROUP_ERROR:
                raise ElasticRunError(_group_error(result_dir, g, code))
            else:
                note_dead(store, g)  # its peers stop waiting for it in a quorum it had joined (peers.py)
                watch.failures += 1
                watch.ever_failed.add(g)
                watch.failed_at.setdefault(g, []).append(time.time())
                restarts = watch.restarts[g] < rel.max_restarts and watch.first_done_at is None
                why = _failure_reason(result_dir, g, code)
                _record_failure(config, g, _int(store, f"step/{g}"), describe_exit(code),
                                watch.restarts[g] + 1 if restarts else None)
                if restarts:
                    watch.restarts[g] += 1
                    watch.say(g, f"failed ({why}): restart {watch.restarts[g]} of {rel.max_restarts}")
                    store.set(incarnation_key(g), str(watch.restarts[g]))  # its stages meet in a new group store
                    watch.restart(supervisor, store, g)
                else:
                    supervisor.stop(watch.ranks(g), term_s=0.0)  # its stages still running
                    watch.down.add(g)
                    store.set(down_key(g), "1")  # an elected asynchronous server stops waiting for it
                    if watch.first_done_at is None:
                        watch.say(g, f"failed ({why}): down for good after "
                                     f"{watch.restarts[g]} restarts")
        if len(watch.done) + len(watch.down) == watch.groups:
            break
        if watch.first_done_at is not None and now - watch.first_done_at > FINISH_GRACE_S:
            break  # the rest is stopped by the supervisor; they missed the end
        trained_s = _trained_s(store)
        while pending and trained_s is not None and trained_s >= pending[0].at_s:
            group = _kill_target(store, config, pending.pop(0))
            if group_code(codes, watch.ranks(group)) is None and watch.first_done_at is None:
                watch.kills += 1
                watch.say(group, f"killed by --chaos at {trained_s:.1f} s")
                supervisor.stop(watch.ranks(group), term_s=0.0)  # every stage of the group
        if trained_s is not None:
            _partitions(supervisor, watch, cuts, links, trained_s, codes)
        _say_rejoins(store, watch)
        if progress is not None:
            done = max((_int(store, f"step/{g}") for g in range(watch.groups)), default=0)
            if done != last_progress:
                progress(done, config.run.steps)
                last_progress = done
        time.sleep(poll_s)
    if not watch.done:
        raise ElasticRunError(f"no replica group finished (down for good: {sorted(watch.down)})")


def _kill_target(store: Any, config: RuntimeConfig, kill: Kill) -> int:
    """The group `kill` hits: its own, or (site=host) the group hosting the global model's server now."""
    if kill.group is not None:
        return kill.group
    from geotrain.runtime.elastic.async_regions import global_model_host

    return global_model_host(store, config)


def _partitions(supervisor: Supervisor, watch: _Watch, cuts: list[Cut],
                links: tuple[Any, LocalHosts], trained_s: float, codes: tuple[int | None, ...]) -> None:
    """Heal the links due to heal, cut those due (a running group not already cut) and, once a group has
    finished, stop the groups still cut off (they missed the end)."""
    changed = False
    for g, heal_s in list(watch.cut.items()):
        if trained_s >= heal_s:
            del watch.cut[g]
            watch.healed_at.setdefault(g, []).append(time.time())
            watch.say(g, f"links healed at {trained_s:.1f} s")
            changed = True
    while cuts and trained_s >= cuts[0].at_s:
        cut = cuts.pop(0)
        if group_code(codes, watch.ranks(cut.group)) is None and cut.group not in watch.cut \
                and watch.first_done_at is None:
            watch.cut[cut.group] = heal_s = cut_heal_s(cut, trained_s)
            watch.partitions += 1
            watch.say(cut.group, f"cut off by --chaos at {trained_s:.1f} s until {heal_s:.1f} s")
            changed = True
    if watch.first_done_at is not None and watch.cut:
        supervisor.stop([rank for g in watch.cut for rank in watch.ranks(g)], term_s=0.0)
        watch.down.update(watch.cut)
        watch.cut.clear()
        changed = True
    if changed:
        links[1].set_cut(links[0], watch.cut)


def _record_failure(config: RuntimeConfig, group: int, step: int, exit: str, restart: int | None) -> None:
    """A "failure" event on each of `group`'s ranks in the run directory (its processes cannot write it):
    at the step it was in (`step` committed before), with how it ended and the restart it gets (None: none)."""
    for position in map(lambda rank: group_position(config, rank), range(group_size(config))):
        launcher_event(config, config.layout.rank_of(position.stage, group, position.shard), "failure", step,
                       reason=f"replica group {group} {exit}", exit=exit, restart=restart)


def _say_rejoins(store: Any, watch: _Watch) -> None:
    """Report the rejoins the groups recorded since the last look (group, step, recovery seconds)."""
    if watch.on_event is None:
        return
    count = _int(store, "rejoins")
    while watch.rejoins_seen < count:
        watch.rejoins_seen += 1
        try:
            rejoin = json.loads(store.get(f"rejoin/{watch.rejoins_seen}").decode())
        except Exception:  # noqa: BLE001 - a report only
            continue
        watch.say(int(rejoin["group"]), f"rejoined at step {rejoin['step']} "
                                         f"(recovered from a live peer in {rejoin['seconds']:.1f} s)")


def _trained_s(store: Any) -> float | None:
    """Seconds since the first start-up quorum (the chaos clock), None before it."""
    try:
        return time.time() - float(store.get("t0").decode()) if store.check(["t0"]) else None
    except Exception:  # noqa: BLE001 - the chaos waits for the next tick
        return None


def _int(store: Any, key: str) -> int:
    try:
        return int(store.get(key).decode()) if store.check([key]) else 0
    except Exception:  # noqa: BLE001 - progress only
        return 0


def _failure_reason(result_dir: Path, group: int, code: int) -> str:
    """How replica group `group` ended (exit `code`), with the error a process of it wrote, if any (group.failure_file;
    read once: a restarted group writes its own)."""
    exited = describe_exit(code)
    for path in sorted(result_dir.glob(failure_file(group, "*"))):
        try:
            line = path.read_text().strip()
            path.unlink()
        except OSError:
            continue
        if line:
            return f"{exited}: {line}"
    return exited


def _group_error(result_dir: Path, group: int, code: int) -> str:
    try:
        return (result_dir / f"error-{group}.txt").read_text().strip()
    except OSError:
        return f"replica group {group} {describe_exit(code)}"


def _recoveries(since: dict[int, list[float]], rejoins: list[dict[str, Any]]) -> list[float]:
    """Per event (group -> unix times: failures, heals), seconds to that group's next rejoin (none: left out)."""
    seconds = []
    for g, times in since.items():
        healed = sorted(r["t"] for r in rejoins if r["group"] == g)
        for at in times:
            after = [t for t in healed if t >= at]
            if after:
                seconds.append(after[0] - at)
    return seconds


def _summary(config: RuntimeConfig, watch: _Watch, result_dir: Path, store: Any, wall_s: float) -> ElasticSummary:
    finished = read_groups(result_dir, watch.groups, group_size(config))
    steps = max((s["steps"] for s in finished.values()), default=0)
    rejoin_count = _int(store, "rejoins")
    rejoins = [json.loads(store.get(f"rejoin/{n}").decode()) for n in range(1, rejoin_count + 1)]
    commits = [json.loads(store.get(f"commit/{t}").decode()) if store.check([f"commit/{t}"]) else None
               for t in range(steps)]
    contributors = [c[0] for c in commits if c is not None]
    trained = [c[2] if len(c) > 2 else c[0] for c in commits if c is not None]  # adaptive: the steps taken, in H's
    every = config.optim.sync_every or 1
    t0 = float(store.get("t0").decode()) if store.check(["t0"]) else 0.0
    final = json.loads(store.get(FINAL_KEY).decode()) if store.check([FINAL_KEY]) else None  # asynchronous
    last = final["t"] if final else max((c[1] for c in commits if c is not None), default=t0)
    updates = None if final is None else int(final["updates"])
    val = [s["val_loss"] for s in finished.values()]
    emulated = [s["records"][-1]["emulated_s"] for s in finished.values() if s["records"]]
    return ElasticSummary(
        steps=steps, losses=mean_losses(finished, steps), val_loss=val[0] if val else None,
        replica_failures=watch.failures, rejoins=rejoin_count, global_restarts=0,
        max_param_diff_across_replicas=max_stage_param_diff(result_dir, sorted(finished), group_size(config)),
        recovery_s=_recoveries(watch.failed_at, rejoins),
        stall_s=stall_seconds(finished, set(range(watch.groups)) - watch.ever_failed - set(watch.healed_at)),
        train_s=last - t0, samples=round((sum(trained) if updates is None else updates) * every
                                         * config.schedule.batch_size),
        contributors=contributors, kills=watch.kills, restarts=list(watch.restarts),
        groups_finished=sorted(finished), wall_s=wall_s,
        group_records={g: summary["records"] for g, summary in sorted(finished.items())},
        partitions=watch.partitions, partition_recovery_s=_recoveries(watch.healed_at, rejoins),
        train_emulated_s=max(emulated) if emulated and None not in emulated else None,
        elections=_int(store, "async/elections"), lost_updates=_int(store, "async/lost_updates"),
        resent_updates=_int(store, "async/resent_updates"), global_updates=updates)
