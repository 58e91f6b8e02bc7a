"""Which runs can be elastic: the (stages, sync) combinations and settings the elastic runtime supports,
checked when the config is built, each refusal one line naming the setting and its value. The pairs of
--elastic and one other setting are rules of the composition table (runtime/composition.py).

Supported: pipeline S = 1 (a replica group is one process) and S > 1 (a group is S processes, one per stage; GPipe, a
plain split, kill and partition chaos), any replicas R >= min_replicas, sharded plans (K > 1 devices per slot:
DiLoCo, blocking, streaming or adaptive local steps, kill and partition chaos; a group is S x K processes, FSDP2
among each stage's K, the outer sync per (stage, shard) between the same position of every group), on CPU (torchft's
reconfigurable gloo; on the emulating backend with --time-scale > 0, every process of a group on its own device's
links, runtime/elastic/links.py, or with a partition) or on CUDA (the exchange's host copies on gloo; S x K > 1: a
GPU per process, the group's own FSDP2 and pipeline groups NCCL inside a site, runtime/elastic/stage.py; not with a
partition or --netlab: cuda_group_blocker; not asynchronous groups; not yet run on a GPU); DP synchronisation either
every step (gradient mean, no --sync-every), blocking
DiLoCo (--sync-every H), streaming DiLoCo (--fragments P, --sync-delay tau: each fragment's exchange committed when
posted, landed tau steps later; --sync-moments: the inner AdamW's moments in the same try; S x K > 1: each position's
fragments of its own parameters, every position of a group meeting the group's quorum at the same steps) or adaptive
local steps (--local-steps adaptive, blocking; a group of S x K > 1 processes takes one split, its processes' max step
seconds; --resume and --stop-after at outer syncs, the checkpoint holding the outer-sync index, the measured step
seconds and the split: geotrain.sync.elastic_adaptive); per-step sync with batch shares (--batch-shares speed or
W1,W2,...: each group its windows, its gradient weighted by them in the quorum's mean; not 'measured'); any codec of
geotrain.codecs with or without error feedback (the codec reducer on torchft's group: geotrain.sync.elastic; not
PowerSGD, its own exchange), flat or --dp-hierarchical, AdamW; or 1-bit Adam per step (--optimizer onebit-adam: S = 1,
equal batch shares, flat, CPU; geotrain.sync.elastic_onebit); or asynchronous outer updates (--outer-sync async or
async-hierarchical: groups as TCP clients of elected hosts, runtime/elastic/async_group.py; S x K > 1: kill chaos,
checkpoints, emulated links, --sync-moments and --fragments, each position the client of its position's server (with
async-hierarchical its region's, whose host pushes to the same position's global server), one election for all per
tier; at --time-scale
> 0 each request and reply sleeps its emulated link time x the scale, runtime/elastic/links.py SocketPacing, and
--emulate-gpu-speed sleeps each step's compute out to its GPU's speed at any scale; a partition holds each message whose
either end is cut until the heal, links.CutHold; checkpoints, --resume and --stop-after at any step of the equal
schedule, written by the global model's host: runtime/elastic/async_checkpoint.py; --sync-moments: every server, push,
reply, copy and checkpoint holds [parameters | AdamW's second moments], so an elected host serves the global moments of
its copy: sync/async_moments.py; --fragments P: a FragmentServer per elected host (with async-hierarchical each region's
too, merging upstream per fragment), pushes at streaming's offsets, the copy held per fragment:
runtime/elastic/fragment_copy.py; with --netlab a host serves on its lab address). With --netlab: --time-scale 0 (the
lab shapes the links) and no --lighthouse (the launcher starts one inside the lab); a group of S x K > 1 processes has
each in its own device's namespace (runtime/elastic/hosts.py), and a partition there cuts the links between its
devices and the other sites only (netlab.cuts).
Partitions: a cut group (all its S x K processes, together) rejoins by live recovery; one that heals after the
launch's last committed sync (a fast survivor finished first) takes a finished peer's final parameters instead
(runtime/elastic/late.py).

Checkpoints (--checkpoint-dir, runtime/elastic/checkpoint.py): a restarted group recovers from a live
peer, not from disk; the checkpoint is for the run's end or for a device lost for good (a re-plan
resumed by `train --resume`, elastic or not). After a committed step that is due, the group with rank 0
in that step's torchft quorum writes one copy of the state in the non-elastic format (one shard per
stage); with --sync-every only at outer-round ends, so --checkpoint-every must be a multiple of H (asynchronous runs:
one copy by the global model's host, at any step).
`--elastic --resume` starts every group at the checkpoint's step; `--stop-after K` stops every group K steps after
the launch's start (with --sync-every: K a multiple of H), with a checkpoint there.
"""

from __future__ import annotations

from typing import Any

from geotrain.comm.registry import reducer_traits
from geotrain.runtime.elastic.chaos import has_partition, kills_host
from geotrain.runtime.sections import RuntimeConfigError

PIPELINE_SCHEDULE = "gpipe"
ASYNC_SYNCS = ("async", "async-hierarchical")
"""The --outer-sync modes whose elastic groups are clients of an elected server (runtime/elastic/async_group.py)."""
"""The pipeline schedule of elastic groups of S > 1 stages (the one tested across a group's restarts)."""


def pipeline_refusal(config: Any) -> str | None:
    """Why an elastic plan of S > 1 stages cannot run with `config`'s other settings, or None (S = 1: None)."""
    if config.stages == 1:
        return None
    rel, s = config.reliability, f"S = {config.stages}"
    reasons = (
        (config.schedule.schedule != PIPELINE_SCHEDULE,
         f"schedule {config.schedule.schedule!r}: elastic groups of {s} stages run {PIPELINE_SCHEDULE!r} only"),
        (config.schedule.split == "time",
         f"schedule.split 'time': elastic groups of {s} stages need a split that a restarted group repeats "
         f"exactly; use 'layers' or 'params'"),
    )
    return next((text for failed, text in reasons if failed), None)


def elastic_refusal(config: Any) -> str | None:
    """Why `config` (a RuntimeConfig with reliability.elastic) cannot run elastic, or None. The pairs of
    --elastic and another setting (codecs, streaming, 1-bit Adam, --device cuda, ...) are rules of the
    composition table (runtime/composition.py); these are the conditions beside them."""
    optim = config.optim
    own = [str(spec) for spec in (config.comm.dp_codec, *config.comm.dp_codecs)
           if not reducer_traits(spec).hierarchical]
    reasons = (
        (bool(own), f"codec {own[0] if own else ''!r} is its own exchange (not a codec of geotrain.codecs): elastic "
                    f"groups run a codec reducer on torchft's group; use a codec such as int8-block"),
        (config.stages_per_rank != 1,
         f"schedule {config.schedule.schedule!r}: elastic runs have one stage per group (no looped schedules)"),
        (config.reliability.min_replicas > config.replicas,
         f"reliability.min_replicas {config.reliability.min_replicas} is more than the plan's {config.replicas} "
         f"replica groups"),
        (optim.sync_every is None and optim.sync_delay > 0,
         f"optim.sync_delay {optim.sync_delay} without --sync-every (delayed gradients): elastic runs overlap "
         f"nothing per step; use --sync-every H for streaming DiLoCo"),
        (optim.sync_every is not None and config.checkpoint.checkpoint_every % optim.sync_every != 0
         and optim.outer_sync not in ASYNC_SYNCS,
         f"checkpoint.checkpoint_every {config.checkpoint.checkpoint_every}: elastic runs with --sync-every "
         f"{optim.sync_every} checkpoint at outer-round ends only; use a multiple of {optim.sync_every}"),
        (config.reliability.netlab and config.emulation.time_scale > 0,
         f"reliability.netlab: the lab shapes the links itself; emulation.time_scale {config.emulation.time_scale!r} "
         f"would add the emulated link times on top: pass --time-scale 0"),
        (config.reliability.netlab and config.reliability.lighthouse is not None,
         "reliability.netlab: the Lighthouse runs inside the lab; drop --lighthouse"),
        (config.run.device == "cuda" and config.stages * config.layout.k > 1
         and (config.reliability.netlab or partitions(config)),
         f"run.device cuda with a plan of {config.stages} stages x {config.layout.k} devices per slot: not built yet "
         f"with {cuda_group_blocker(config)}; use S = 1, K = 1 or --device cpu"),
        (config.run.device == "cuda" and optim.outer_sync in ASYNC_SYNCS,
         f"run.device cuda with --outer-sync {optim.outer_sync}: elastic asynchronous groups compute on the CPU (not "
         f"built yet: their model, pushes and copies on a GPU); use --device cpu"),
        (config.schedule.batch_shares == "measured",
         "schedule.batch_shares 'measured': not built yet for elastic groups (re-balancing needs every group of a "
         "changing quorum to agree on the measured speeds); use speed or explicit weights"),
        (optim.sync_every is not None and config.run.stop_after is not None
         and config.run.stop_after % optim.sync_every != 0 and optim.outer_sync not in ASYNC_SYNCS,
         f"run.stop_after {config.run.stop_after}: elastic runs with --sync-every {optim.sync_every} stop at "
         f"outer-round ends only (their checkpoints are written there); use a multiple of {optim.sync_every}"),
        (config.reliability.chaos is not None and kills_host(config.reliability.chaos)
         and optim.outer_sync not in ASYNC_SYNCS,
         f"reliability.chaos {config.reliability.chaos!r}: site=host kills the host of the global model's server, "
         f"which only --outer-sync {' or '.join(ASYNC_SYNCS)} has; name a site or leave it drawn"),
    )
    return next((text for failed, text in reasons if failed),
                pipeline_refusal(config) or onebit_refusal(config))


def partitions(config: Any) -> bool:
    """Whether `config`'s --chaos cuts links (a partition)."""
    return config.reliability.chaos is not None and has_partition(config.reliability.chaos)


def cuda_group_blocker(config: Any) -> str:
    """What keeps an elastic group of S x K > 1 processes off CUDA in `config` (elastic_refusal): its own groups
    are NCCL inside a site there (comm/groups.group_backend), which the link emulator (gloo only) cannot wrap for a
    partition nor a lab namespace's gloo interface setting steer (asynchronous groups: elastic_refusal's own line)."""
    if config.reliability.netlab:
        return "--netlab (the lab steers gloo's interface only, not NCCL's)"
    return (f"a partition in --chaos {config.reliability.chaos!r} (the link emulator that cuts a group wraps gloo "
            f"groups only, not the group's NCCL ones)")


def onebit_refusal(config: Any) -> str | None:
    """Why an elastic `--optimizer onebit-adam` run (geotrain.sync.elastic_onebit: groups of one process, each
    weighing 1) cannot run with `config`'s other settings, or None (not 1-bit Adam: None)."""
    if config.optim.optimizer != "onebit-adam":
        return None
    why = "--optimizer onebit-adam: elastic 1-bit Adam runs groups of one process on CPU, each weighing 1"
    reasons = (
        (config.stages > 1, f"{why} (not built yet: a plan of {config.stages} stages); use S = 1"),
        (config.schedule.batch_shares != "equal",
         f"{why} (not built yet: batch shares {config.schedule.batch_shares!r}); use --batch-shares equal"),
        (config.comm.dp_hierarchical, f"{why} (not built yet: --dp-hierarchical, regions as its workers on a quorum)"),
        (config.run.device == "cuda", f"{why} (not built yet: --device cuda, its messages through host copies)"),
    )
    return next((text for failed, text in reasons if failed), None)


def sleeps_gpu_speed(config: Any) -> bool:
    """Whether `config` runs --emulate-gpu-speed on elastic asynchronous groups, whose compute sleeps out its device's
    slowness in wall time at any time scale (runtime/elastic/async_group.py: no emulated clock counts it there; the
    other runs count it on the emulated clock, so they need --time-scale > 0)."""
    return bool(config.reliability.elastic and config.optim.outer_sync in ASYNC_SYNCS
                and config.emulation.emulate_gpu_speed)


def check_elastic(config: Any) -> None:
    """RuntimeConfigError (one line) unless `config` is an elastic run the runtime supports (or not elastic)."""
    if not config.reliability.elastic:
        return
    reason = elastic_refusal(config)
    if reason is not None:
        raise RuntimeConfigError(f"--elastic: {reason}")
