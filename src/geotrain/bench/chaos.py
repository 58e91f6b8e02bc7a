"""`geotrain bench chaos`: goodput of elastic replica groups (torchft) under killed and partitioned sites,
beside the synchronous runtime that must restart from its last checkpoint.

The WAN benchmark's model (`tiny` GPT) and cluster (wan-4x1: 4 sites, one replica each, pipeline S = 1),
plain gloo on this machine (no link emulation: failures and recovery are what is measured). A partition
is a link state of the emulating backend, so the partition row and its own failure-free reference run on
it, at a time scale (LINK_STATE_TIME_SCALE) where the links cost microseconds: the backend's own cost
(one stamp all-gather per all-reduce) is then in both. Rows:
  elastic, no failures             the reference of the kill row
  elastic, kill a site every T     --chaos kill-site:every=T (T = a quarter of the reference's training
                                   time, seeded sites), each killed group restarted, rejoining live
  elastic (emulating backend), no failures   the reference of the partition row
  elastic, partition a site        --chaos partition:every=T,for=T/2 (the same count, seeded sites): the
                                   group's links cut, the others go on, it rejoins live when they heal
  sync+ckpt, no failures           the runtime's synchronous run with a checkpoint every `checkpoint_every`
  sync+ckpt, kill a site every T   a worker SIGKILLed at the same times: the run ends, and is launched
                                   again with --resume from its last checkpoint (a global restart)
  sync+ckpt, partition a site      a worker SIGKILLed at each partition's start (a synchronous run cannot
                                   go on without the site), relaunched with --resume once the links heal
                                   (T/2 later; optimistic for the baseline: it pays no collective timeout)
With `netlab` (opt-in: root, and minutes more), two rows after those, on real shaped TCP (`train --elastic
--netlab`: each group in its device's lab namespace, the cluster's bandwidths; --comm-timeout
NETLAB_COMM_TIMEOUT_S, since a lab cut raises nothing and the survivors wait out their collective):
  elastic (netlab), no failures    the reference of the next row
  elastic (netlab), partition ...  the same partitions, each the group's site cut off in the lab, then healed
Then, last (after the netlab rows, if any), a pair of rows per entry of MIXED_GPU_ROWS: the recipes a mixed-GPU user
gets, on bench hetero's 4 sites of 4 GPU generations (hetero-4x1), compute at each GPU's speed counted in CPU
seconds, links ~free as the partition rows' (LINK_STATE_TIME_SCALE):
  elastic adaptive (hetero-4x1), no failures   ADAPTIVE_RECIPE: DiLoCo H = 5 with outer averaging and int8-block,
                                   --local-steps adaptive: the reference of the next row
  elastic adaptive (hetero-4x1), kill a site every T'   the same kills (T' a quarter of its own reference's
                                   training time): a restarted group rejoins at an outer sync and is re-balanced
  async+ckpt (hetero-4x1), no failures   ASYNC_RECIPE (bench hetero's async row: H = 5, --outer-sync async) with a
                                   checkpoint every `checkpoint_every` steps: the reference of the next row
  async+ckpt restart (hetero-4x1), kill a site every T'   a worker SIGKILLed at each T' (as the sync+ckpt rows):
                                   the run ends and is launched again with --resume from its last checkpoint
  elastic async (hetero-4x1), no failures   the same asynchronous updates on elastic groups (train --elastic
                                   --outer-sync async: the global model's server hosted by one group, re-elected from
                                   the freshest copy when its host dies), at --time-scale 0 (its groups talk over plain
                                   TCP), each group sleeping out its GPU's slowness (ELASTIC_ASYNC_RECIPE)
  elastic async (hetero-4x1), kill a site every T'   the first kill the global model's host's (kill-site site=host),
                                   the others drawn; a killed group restarts and rejoins as a client
  elastic async-hierarchical (hetero-4x1), ...   the same pair with a server per region too (--outer-sync
                                   async-hierarchical; hetero-4x1's regions are one group each)
goodput = useful samples per second of training, relative to the row's failure-free reference (the
kill row to the first row, the partition row to the third, the sync rows to the fifth, the netlab
partition row to the eighth, each mixed-GPU kill row to its own reference). Useful samples: every
committed step's contributing groups' batches (a step redone after a restart counts once); asynchronous
updates: the samples in the updates the final global model holds (async_useful_samples: its replica outer
gradients x H x the batch; an update lost with a killed run, or discarded past the run's budget, is not in it).
Seconds: from the first step's start to the last commit (elastic; asynchronous: from the first group's join to the
first holder of the final global model), or from the first launch's first completed step (asynchronous: every rank's)
to the last launch's end (restart rows, restarts included).
recovery_s: from a failure to the failed unit training again (the group's rejoin; the relaunched run's
first new step); for the partition rows from the heal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from geotrain.bench.hetero import HETERO_CLUSTER_NAME, OUTER_AVERAGE
from geotrain.bench.wan_rows import WAN_CLUSTER_NAME, bench_cluster
from geotrain.errors import GeotrainError


LINK_STATE_TIME_SCALE = 1e-6
"""The time scale of the partition row and its reference: on the emulating backend (whose link state a
partition cuts), with link times shrunk to microseconds of wall time (wan-4x1's all-reduce: ~1 s emulated)."""


NETLAB_COMM_TIMEOUT_S = 5.0
"""--comm-timeout of the netlab rows: the survivors of a real partition stall this long (their collective
with the silent group times out), instead of the default 120 s."""


ADAPTIVE_CLUSTER = HETERO_CLUSTER_NAME
ADAPTIVE_RECIPE: dict[str, Any] = {**dict(OUTER_AVERAGE), "local_steps": "adaptive", "emulate_gpu_speed": True,
                                   "compute_clock": "cpu"}
"""The adaptive rows' settings (bench hetero's diloco-adaptive recipe, blocking: an elastic adaptive sync does not
overlap). CPU seconds: this machine's load (the other runs of a loaded CI host) does not move the split."""
ASYNC_RECIPE: dict[str, Any] = {**dict(OUTER_AVERAGE), "outer_sync": "async", "emulate_gpu_speed": True,
                                "compute_clock": "cpu"}
"""The asynchronous rows' settings: bench hetero's async row (H = 5, outer averaging, int8-block, a stale update at
full weight), compute at each GPU's speed in CPU seconds as the adaptive rows'."""


@dataclass(frozen=True)
class MixedGpuRows:
    """A pair of rows of one recipe on ADAPTIVE_CLUSTER: `name` without failures (the reference), then `killed_name`
    (default `name`) with a site killed every T' (a quarter of the reference's training seconds): an elastic run's
    kill-site chaos if `elastic`, else a worker SIGKILLed and the run relaunched with --resume (sync_row). Elastic
    rows run at `time_scale`; `kill_host`: the first kill is the global model's host's (kill-site site=host), the
    others drawn."""

    name: str
    recipe: Mapping[str, Any]
    elastic: bool
    killed_name: str | None = None
    time_scale: float = LINK_STATE_TIME_SCALE
    kill_host: bool = False


ELASTIC_ASYNC_RECIPE: dict[str, Any] = {**ASYNC_RECIPE, "compute_clock": "wall"}
"""The elastic asynchronous rows' settings: ASYNC_RECIPE at --time-scale 0 (free links, as the other rows': these rows
measure GPU speed and failures), where --emulate-gpu-speed sleeps out each group's GPU slowness in wall time (x its
measured wall compute: no emulated clock counts CPU seconds)."""


MIXED_GPU_ROWS: tuple[MixedGpuRows, ...] = (
    MixedGpuRows("elastic adaptive", ADAPTIVE_RECIPE, elastic=True),
    MixedGpuRows("async+ckpt", ASYNC_RECIPE, elastic=False, killed_name="async+ckpt restart"),
    MixedGpuRows("elastic async", ELASTIC_ASYNC_RECIPE, elastic=True, time_scale=0.0, kill_host=True),
    MixedGpuRows("elastic async-hierarchical", {**ELASTIC_ASYNC_RECIPE, "outer_sync": "async-hierarchical"},
                 elastic=True, time_scale=0.0, kill_host=True),
)
"""The mixed-GPU row pairs, in order: the asynchronous restart rows are the baseline of the elastic asynchronous ones
(the global model's server hosted by one group, re-elected from the freshest copy when its host dies:
runtime/elastic/async_group.py; hierarchical: a server per region as well, async_regions.py; on hetero-4x1 every
site is a region of one group, so each region server relays one group's updates)."""


HEARTBEATS_PER_TIMEOUT = 5
"""Heartbeats per heartbeat timeout in every row: a group (worker) counts as lost after missing about five."""


class ChaosBenchError(GeotrainError, ValueError):
    """A bench chaos option that cannot make a run."""


@dataclass(frozen=True)
class ChaosBenchConfig:
    """The runs: steps, per-replica batch, sequence length, model, seed, heartbeat timeouts (s: the elastic rows'
    groups', the restart rows' workers'), the sync baseline's checkpoint cadence (steps), kills per failing row,
    DiLoCo's H (None: every step), and whether to add the netlab rows (root)."""

    cluster: str = WAN_CLUSTER_NAME
    steps: int = 400
    batch_size: int = 4
    seq_len: int = 32
    model: str = "tiny"
    seed: int = 0
    heartbeat_timeout_s: float = 0.5
    worker_heartbeat_timeout_s: float = 1.5
    checkpoint_every: int = 40
    kills: int = 3
    sync_every: int | None = None
    netlab: bool = False
    run_dir: str | None = None  # each row's run directory under it (geotrain.observe.run.row_run_dir); None: none

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size", "seq_len", "checkpoint_every", "kills"):
            if getattr(self, key) < 1:
                raise ChaosBenchError(f"bench chaos: {key} must be an integer >= 1, got {getattr(self, key)}")


@dataclass(frozen=True)
class ChaosRow:
    """One row of the table (see the module doc)."""

    label: str
    goodput: float
    steps: int
    global_restarts: int
    recoveries: int
    recovery_s: list[float]
    val_loss: float | None
    train_s: float
    samples: int
    failures: int
    elections: int = 0


def goodput(samples: int, seconds: float, reference_samples: int, reference_seconds: float) -> float:
    """Useful samples per second relative to the reference's (1.0: as fast as the reference)."""
    return (samples / seconds) / (reference_samples / reference_seconds)


def async_useful_samples(global_updates: int, sync_every: int, batch_size: int) -> int:
    """Samples in an asynchronous run's final global model: `global_updates` replica outer gradients, each `sync_every`
    inner steps of `batch_size` sequences."""
    return global_updates * sync_every * batch_size


def heartbeat_settings(config: ChaosBenchConfig, elastic: bool) -> dict[str, float]:
    """A row's heartbeat timeout and interval (seconds): an elastic row's groups' (their torchft Managers beat from
    Rust threads, which no Python work holds up: the lighthouse drops a killed group after this, the stall of the
    survivors' quorum), a restart row's workers' (Python threads); HEARTBEATS_PER_TIMEOUT beats per timeout."""
    timeout_s = config.heartbeat_timeout_s if elastic else config.worker_heartbeat_timeout_s
    return {"heartbeat_timeout_s": timeout_s, "heartbeat_interval_s": timeout_s / HEARTBEATS_PER_TIMEOUT}


def _settings(config: ChaosBenchConfig, elastic: bool, **more: Any) -> dict[str, Any]:
    common = {"steps": config.steps, "batch_size": config.batch_size, "microbatches": 1, "seq_len": config.seq_len,
              "model_name": config.model, "seed": config.seed, "time_scale": 0.0, "eval_every": config.steps,
              **heartbeat_settings(config, elastic), "sync_every": config.sync_every, "eval_windows": 64}
    return {**common, **({"elastic": True} if elastic else {}), **more}


def _runtime_config(config: ChaosBenchConfig, elastic: bool, label: str, cluster_name: str | None = None,
                    **more: Any) -> Any:
    """The row `label`'s run (its run directory under config.run_dir, if any) on `cluster_name` (None: the
    config's cluster)."""
    from geotrain.cluster import load_cluster
    from geotrain.observe.run import row_run_dir
    from geotrain.runtime import RuntimeConfig

    cluster = load_cluster(bench_cluster(cluster_name or config.cluster))
    run_dir = None if config.run_dir is None else row_run_dir(config.run_dir, label)
    return RuntimeConfig.of(cluster, [list(range(cluster.n_devices))], "chaos", run_dir=run_dir,
                            **_settings(config, elastic, **more))


def elastic_row(label: str, config: ChaosBenchConfig, chaos: str | None, tokens: Any, time_scale: float = 0.0,
                netlab: bool = False, recipe: Mapping[str, Any] | None = None) -> tuple[ChaosRow, Any]:
    """An elastic run with `chaos` (None: no failures), in a netlab if `netlab`, the settings `recipe` on mixed GPUs
    (ADAPTIVE_CLUSTER) if given; the row's failures are kills plus partitions."""
    from geotrain.observe.run import recording
    from geotrain.runtime.elastic.launch import launch_elastic
    from geotrain.sync.async_step import progress_steps

    lab = {"netlab": True, "comm_timeout_s": NETLAB_COMM_TIMEOUT_S} if netlab else {}
    mixed = {} if recipe is None else {"cluster_name": ADAPTIVE_CLUSTER, **recipe}
    run = _runtime_config(config, True, label, chaos=chaos, time_scale=time_scale, **lab, **mixed)
    with recording(run):
        summary = launch_elastic(run, tokens=tokens)
    steps = summary.steps if summary.global_updates is None else \
        progress_steps(summary.global_updates, run.optim.sync_every, run.replicas)  # asynchronous: the final model's
    return ChaosRow(label, 1.0, steps, 0, summary.rejoins, summary.recovery_s + summary.partition_recovery_s,
                    summary.val_loss, summary.train_s, summary.samples,
                    summary.replica_failures + summary.partitions, summary.elections), summary


def _worker_pid(rank: int) -> int | None:
    """The pid of this process's descendant named geotrain-r<rank> (a runtime worker), if any."""
    from geotrain.procs.lifeline import descendant_named

    return descendant_named(f"geotrain-r{rank}")


def sync_row(label: str, config: ChaosBenchConfig, kill_times_s: list[float], tokens: Any,
             ckpt_dir: Path, hold_s: float = 0.0, recipe: Mapping[str, Any] | None = None) -> ChaosRow:
    """The runtime (not elastic) with checkpoints; a worker SIGKILLed at each of `kill_times_s` (seconds after
    the first completed step), the run then launched again with --resume (from scratch if no checkpoint),
    `hold_s` seconds after the kill at the earliest (a partition: the site is unreachable until it heals).
    `recipe`: its settings on mixed GPUs (ADAPTIVE_CLUSTER, links ~free: LINK_STATE_TIME_SCALE), else the
    config's synchronous run. With config.run_dir every launch of the row writes its one run directory (a
    relaunch adds its "resume")."""
    from geotrain.observe.run import recording
    from geotrain.procs import WorkerFailure
    from geotrain.runtime import latest_step, launch
    from geotrain.runtime.elastic.chaos import kill_schedule, parse_chaos

    mixed = {} if recipe is None else {"cluster_name": ADAPTIVE_CLUSTER, "time_scale": LINK_STATE_TIME_SCALE,
                                       **recipe}
    base = _runtime_config(config, False, label, checkpoint_dir=str(ckpt_dir), checkpoint_every=config.checkpoint_every,
                           overwrite=True, **mixed)
    kills = kill_schedule(parse_chaos(f"kill-site:every=1s,count={max(1, len(kill_times_s))}"), base.replicas,
                          config.seed)
    state: dict[str, Any] = {"t0": None, "resumed_at": 0, "killed_at": None, "recovery": [], "launches": 0,
                             "started_at": None}

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if state["t0"] is None and done > 0:
            state["t0"] = now
        killed = state["killed_at"]
        if killed is None or state["launches"] <= killed[1] or done == 0:
            return
        # the relaunched run's first new step: its least rank's count moves off where every rank started (the
        # checkpoint's step; an asynchronous rank's own steps), or a run from scratch steps once
        if state["started_at"] is None and state["resumed_at"]:
            state["started_at"] = done
        elif state["started_at"] is None or done != state["started_at"]:
            state["recovery"].append(now - killed[0])
            state["killed_at"] = None

    stop = threading.Event()

    def killer() -> None:
        for kill, at in zip(kills, kill_times_s):
            while not stop.is_set() and (state["t0"] is None or time.monotonic() - state["t0"] < at):
                time.sleep(0.05)
            pid = None if stop.is_set() else _worker_pid(kill.group)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                state["killed_at"] = (time.monotonic() + hold_s, state["launches"])  # recovery counts from the heal

    thread = threading.Thread(target=killer, name="bench-chaos-killer")
    thread.start()
    restarts, report, failures = 0, None, 0
    with contextlib.ExitStack() as stack:
        stack.enter_context(recording(base))
        stack.callback(thread.join)
        stack.callback(stop.set)
        run = base
        while report is None:
            state["launches"] += 1
            try:
                report = launch(run, progress=progress, tokens=tokens).report
            except WorkerFailure:
                if state["killed_at"] is not None:
                    time.sleep(max(0.0, state["killed_at"][0] - time.monotonic()))
                failures += 1
                restarts += 1
                resumed = latest_step(str(ckpt_dir))
                state["resumed_at"], state["started_at"] = resumed or 0, None
                checkpoint = replace(base.checkpoint, resume=resumed is not None, overwrite=resumed is None)
                run = replace(base, checkpoint=checkpoint)
    seconds = time.monotonic() - state["t0"]
    val = report.validation[-1][1] if report.validation else None
    samples = (config.steps * config.batch_size * base.replicas if report.global_updates is None
               else async_useful_samples(report.global_updates, base.optim.sync_every or 1, config.batch_size))
    return ChaosRow(label, 1.0, config.steps, restarts, restarts, state["recovery"], val, seconds, samples, failures)


def kill_spec(every_s: float, kills: int, host: bool = False) -> str:
    """--chaos for `kills` sites killed every `every_s` seconds, drawn from the seed; `host`: the first of them the
    global model's host (site=host), the rest drawn."""
    if not host:
        return f"kill-site:every={every_s:.3f}s,count={kills}"
    rest = f";kill-site:every={every_s:.3f}s,first={2 * every_s:.3f}s,count={kills - 1}" if kills > 1 else ""
    return f"kill-site:every={every_s:.3f}s,count=1,site=host{rest}"


def mixed_gpu_pair(rows: MixedGpuRows, config: ChaosBenchConfig, tokens: Any, ckpt_dir: Path,
                   note: Callable[[str], None]) -> list[tuple[ChaosRow, ChaosRow]]:
    """The (row, reference) pairs of `rows` (MixedGpuRows): its failure-free reference, then `config.kills` sites
    killed every T' (a quarter of the reference's training seconds); restart rows checkpoint under `ckpt_dir`."""
    where = f"({ADAPTIVE_CLUSTER})"
    killed_name = rows.killed_name or rows.name
    note(f"{rows.name} (mixed GPUs), no failures")
    if rows.elastic:
        reference, _ = elastic_row(f"{rows.name} {where}, no failures", config, None, tokens, rows.time_scale,
                                   recipe=rows.recipe)
    else:
        reference = sync_row(f"{rows.name} {where}, no failures", config, [], tokens, ckpt_dir / "reference",
                             recipe=rows.recipe)
    every_s = max(reference.train_s / 4, 1.0)
    label = f"{killed_name} {where}, kill a site every {every_s:.1f} s"
    note(f"{killed_name} (mixed GPUs), kill a site every T")
    if rows.elastic:
        killed, _ = elastic_row(label, config, kill_spec(every_s, config.kills, rows.kill_host), tokens,
                                rows.time_scale, recipe=rows.recipe)
    else:
        killed = sync_row(label, config, [every_s * (k + 1) for k in range(config.kills)], tokens, ckpt_dir / "killed",
                          recipe=rows.recipe)
    return [(reference, reference), (killed, reference)]


def run_chaos_bench(config: ChaosBenchConfig, progress: Any = None) -> list[ChaosRow]:
    """The rows of the module doc (the netlab rows with `config.netlab`, before the mixed-GPU ones), in order;
    `progress(label)` before each."""
    from geotrain.data import world_tokens

    tokens = world_tokens(0)
    note = progress or (lambda label: None)
    note("elastic, no failures")
    reference, _ = elastic_row("elastic, no failures", config, None, tokens)
    every_s = max(reference.train_s / 4, 1.0)
    note("elastic, kill a site every T")
    killed, _ = elastic_row(f"elastic, kill a site every {every_s:.1f} s", config,
                            kill_spec(every_s, config.kills), tokens)
    note("elastic (emulating backend), no failures")
    backend, _ = elastic_row("elastic (emulating backend), no failures", config, None, tokens, LINK_STATE_TIME_SCALE)
    cut_label = f"partition a site every {every_s:.1f} s for {every_s / 2:.1f} s"
    note("elastic, partition a site every T for T/2")
    cut_spec = f"partition:every={every_s:.3f}s,for={every_s / 2:.3f}s,count={config.kills}"
    cut, _ = elastic_row(f"elastic, {cut_label}", config, cut_spec, tokens, LINK_STATE_TIME_SCALE)
    times = [every_s * (k + 1) for k in range(config.kills)]
    with tempfile.TemporaryDirectory(prefix="geotrain-bench-chaos-") as tmp:
        note("sync+ckpt, no failures")
        sync_reference = sync_row("sync+ckpt, no failures", config, [], tokens, Path(tmp) / "a")
        note("sync+ckpt, kill a site every T")
        sync_killed = sync_row(f"sync+ckpt restart, kill a site every {every_s:.1f} s", config, times, tokens,
                               Path(tmp) / "b")
        note("sync+ckpt, partition a site every T for T/2")
        sync_cut = sync_row(f"sync+ckpt restart, {cut_label}", config, times, tokens, Path(tmp) / "c",
                            hold_s=every_s / 2)
    pairs = [(reference, reference), (killed, reference), (backend, backend), (cut, backend),
             (sync_reference, sync_reference), (sync_killed, sync_reference), (sync_cut, sync_reference)]
    if config.netlab:
        note("elastic (netlab), no failures")
        lab_reference, _ = elastic_row("elastic (netlab), no failures", config, None, tokens, netlab=True)
        note("elastic (netlab), partition a site every T for T/2")
        lab_cut, _ = elastic_row(f"elastic (netlab), {cut_label}", config, cut_spec, tokens, netlab=True)
        pairs += [(lab_reference, lab_reference), (lab_cut, lab_reference)]
    with tempfile.TemporaryDirectory(prefix="geotrain-bench-chaos-") as tmp:
        for index, rows in enumerate(MIXED_GPU_ROWS):
            pairs += mixed_gpu_pair(rows, config, tokens, Path(tmp) / str(index), note)
    rows = []
    for row, ref in pairs:
        rows.append(replace(row, goodput=goodput(row.samples, row.train_s, ref.samples, ref.train_s)))
    return rows
