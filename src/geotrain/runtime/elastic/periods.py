"""The loop of an elastic replica group with adaptive local steps (`--elastic --local-steps adaptive`): the group
takes its H_g inner steps of each outer period, then meets the quorum at the period's outer-sync index and syncs
(geotrain.sync.elastic_adaptive: the design, the recovery at a sync, the split over the live quorum, the data).

    run_periods(group)        # instead of ElasticGroup.run's per-step loop

Per period p: inner steps (slice s of the equal schedule's step t, `ElasticAdaptiveSync.position`; the learning rate
at the group's place on the equal schedule), then `quorum()` (a restarted or lagging group recovers a peer's state
here and is at that peer's sync point) and the outer sync, retried on new quorums inside the exchange (a retry's
quorum that hands this group a peer's state: StepSuperseded, the sync again in that quorum, as the recovered peer).
After each committed sync the group's position is the equal schedule's steps done, min((p + 1) x H, steps): what it
reports as its step, commits under (the period's last step) and checkpoints at. The loop ends at the launch's end
(`ElasticGroup.end`: the run's, or --stop-after steps after the resumed checkpoint's, a multiple of H, rules.py),
with a checkpoint there; `--resume` starts it at the checkpoint's outer-sync index with the checkpoint's measured
step seconds and split (ElasticAdaptiveSync.load_state_dict). Records: one per inner step, with
`step` = t (the last period's steps past the run's under its last step), `slice` and `outer_step` (syncs before
it); the period's last record is marked `synced` after the sync (contributors, the digest of the anchor it
stepped, which every group holds after it, the groups in its `quorum`, the `next_local_steps` of every group and the
`step_s` table they came from, null: never measured; with --sync-delay the steps after which its mean lands,
`lands_after`, else null; `moments`: whether the inner AdamW's moments travelled), as a step that synchronises is in
a run of equal steps. The run's last sync lands at once (before its checkpoint); a launch that stops earlier
(--stop-after) checkpoints the sync in flight, then lands it for its own summary. A
group that recovered at a sync has no record of that sync. A group of S x K > 1 processes (stages, shards) runs this
loop in each of them, the same inner steps in lockstep (pipeline sends, FSDP2 collectives): every position sends the
group's max of its processes' step seconds (ElasticAdaptiveSync's `agree`), so all compute the same split.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from geotrain.runtime.elastic.checkpoint import checkpoint_due, save_group_checkpoint, writes_checkpoint
from geotrain.sync.elastic import StepSuperseded


def run_periods(group: Any) -> None:
    """Run replica group `group` (an ElasticGroup whose sync is an ElasticAdaptiveSync) to the run's last period."""
    from geotrain.runtime.elastic.group import params_digest

    sync, config = group.sync, group.config
    steps, every = config.run.steps, sync.sync_every
    group.start()  # a restarted group recovers here: at its peer's sync point, this quorum's exchange to join
    # a group that recovered a peer's start-up state (the start-up quorum formed without it) trains its period first
    quorum_open = group.state.healed and sync.at_sync
    last_record: dict[str, Any] | None = None
    last = time.perf_counter()
    last_period = min(sync.periods, -(-group.end // every))  # --stop-after: the launch's end (a multiple of H)
    while sync.outer_step < last_period:
        if not sync.due:
            t, batch_slice = sync.position()
            record = group.train_step(t, batch_slice, sync.progress_step())
            record.update(step=min(t, steps - 1), slice=batch_slice, outer_step=sync.outer_step,
                          local_steps=sync.my_local_steps)
            record["wall_s"], last = time.perf_counter() - last, time.perf_counter()
            group.state.records.append(record)
            group.observer.step(record)
            last_record = record
            continue
        if not quorum_open:
            group.quorum()  # may recover a peer's state: then at its sync point, joining with weight 0
        try:
            nbytes = sync.outer_sync(group.timer)
        except StepSuperseded:
            quorum_open, last_record = sync.at_sync, None  # recovered in a retry's quorum: sync again in it
            continue
        quorum_open = False
        group.state.step = completed = min(sync.outer_step * every, steps)
        if sync.outer_step >= sync.periods:
            sync.flush(group.timer)  # the run's last sync lands now (a delay): its checkpoint holds the final model
        if last_record is not None and last_record["outer_step"] == sync.outer_step - 1:
            synced = sync.history[-1]
            last_record.update(synced=True, contributors=group.exchange.contributors,
                               params_sha256=params_digest(sync.outer.anchor), dp_bytes=nbytes,
                               quorum=synced["present"], next_local_steps=sync.local_steps,
                               step_s=[s if math.isfinite(s) else None for s in sync.step_s],
                               lands_after=synced["lands_after"], moments=synced["moments"])
        last_record = None
        if checkpoint_due(config, completed, True, group.end) and writes_checkpoint(group.manager.participating_rank()):
            group.observer.event("checkpoint", completed, **save_group_checkpoint(
                config, group.group, group.rank, completed, group.module, sync, group.model.boundaries,
                group.resumed_from))
        if group.rank != 0:
            continue  # rank 0 reports the group's progress and commits (the group's processes commit together)
        group.store.set(f"step/{group.group}", str(completed))
        trained = sum(sync.history[-1]["steps"].values()) / sync.sync_every  # replica-equivalents (samples)
        group.store.set(f"commit/{completed - 1}", json.dumps([group.exchange.contributors, time.time(), trained]))
    sync.flush(group.timer)  # a launch that stops before the run's end (--stop-after): its checkpoint kept the flight
