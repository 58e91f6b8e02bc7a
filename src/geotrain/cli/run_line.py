"""What a `geotrain train` run runs, in one line for people, and the note on `--sync-every`'s outer settings.

    what_runs(config, plan)        "runs: 1 stage x 3 replicas of plan auto on three-sites; sync: ...; batch: ..."
    outer_settings_note(config)    a note when --sync-every keeps DiLoCo's 0.7 / 0.9 on a short run, else None
    async_validation_note(config)  a note when --eval-every meets asynchronous outer updates without --eval-local

The table of a run reports times and losses; this line says which synchronisation, codecs and batch made them
(the JSON has them all in its "config").
"""

from __future__ import annotations

from typing import Any

from geotrain.cost.wan_recipe import PAPER_OUTER_STEPS
from geotrain.optim.outer import DILOCO_LR, DILOCO_MOMENTUM


def _codecs(config: Any) -> str:
    comm = config.comm
    names = sorted({str(c) for c in comm.dp_codecs}) if comm.dp_codecs else [str(comm.dp_codec)]
    text = "/".join(names)
    if text == "none":
        return "fp32"
    feedback = ", error feedback" if comm.error_feedback else ""
    return f"{text}{feedback}{', only between regions' if comm.dp_hierarchical else ''}"


def _sync(config: Any, recipe: bool) -> str:
    optim = config.optim
    if optim.optimizer == "onebit-adam":
        return "1-bit Adam over each stage's DP group"
    if optim.sync_every is None:
        late = f", applied {optim.sync_delay} step(s) late" if optim.sync_delay else ""
        return f"gradients averaged every step through {_codecs(config)}{late}"
    parts = [f"local SGD / DiLoCo every {optim.sync_every} steps (outer lr {optim.outer_lr:g}, momentum "
             f"{optim.outer_momentum:g}), outer deltas through {_codecs(config)}"]
    if optim.fragments > 1:
        parts.append(f"{optim.fragments} fragments cut by {optim.fragment_split}")
    if optim.sync_delay:
        parts.append(f"delay {optim.sync_delay} ({optim.sync_landing} landing)")
    if optim.sync_moments:
        parts.append("moments synced" + (f" in the first {optim.moment_syncs}" if optim.moment_syncs else ""))
    if optim.local_steps == "adaptive":
        parts.append("adaptive local steps")
    if optim.outer_state == "host":
        parts.append("outer state in host memory")
    if optim.outer_sync != "sync":
        parts[0] = (f"asynchronous DiLoCo ({optim.outer_sync}: each replica sends its outer gradient to the global "
                    f"model's server every {optim.sync_every} of its steps and goes on without waiting; outer lr "
                    f"{optim.outer_lr:g}, momentum {optim.outer_momentum:g}), the whole model in fp32 both ways "
                    f"(no codec)")
    return ", ".join(parts) + (" (the plan's WAN recipe)" if recipe else "")


def _plan_batch(plan: Any) -> str:
    """What the plan's job says about the batch (a plan records its job by name only)."""
    name = plan.extra.get("job") if plan is not None else None
    if not isinstance(name, str):
        return ""
    if isinstance(plan.extra.get("global_batch"), int):  # what the plan was priced with (rounded to R)
        batch = plan.extra["global_batch"]
        return f"; the plan was priced for job {name!r}, global batch {batch}, which sets no batch here"
    try:
        from geotrain.job import load_job

        batch = f", global batch {load_job(name).global_batch}"
    except Exception:  # noqa: BLE001 - a job file named by its `name`, not its path: the name alone
        batch = ""
    return f"; the plan was priced for job {name!r}{batch}, which sets no batch here"


def what_runs(config: Any, plan: Any = None) -> str:
    """One line: the layout, the synchronisation (and codecs, recipe), the batch per replica against the plan's."""
    schedule = config.schedule
    recipe = plan is not None and plan.extra.get("wan_recipe") is not None
    shards = f" x {config.layout.k} shards (FSDP2 in a site)" if config.layout.k > 1 else ""
    layout = (f"{config.stages} stage{'s' if config.stages > 1 else ''} x {config.replicas} "
              f"replica{'s' if config.replicas > 1 else ''}{shards} on {config.cluster.name}")
    batch = (f"{schedule.batch_size} sequences per replica (--batch-size) x {config.replicas} = "
             f"{schedule.batch_size * config.replicas} per step, {schedule.microbatches} micro-batches"
             f"{_plan_batch(plan)}")
    return f"runs: {layout}; sync: {_sync(config, recipe)}; batch: {batch}"


def outer_settings_note(config: Any) -> str | None:
    """`--sync-every` with DiLoCo's outer settings (0.7 / 0.9) on fewer than PAPER_OUTER_STEPS outer steps: they
    overshoot there (bench wan, 12 outer steps: +0.25 nats against averaging), and the planner's recipe averages."""
    optim = config.optim
    if optim.sync_every is None or (optim.outer_lr, optim.outer_momentum) != (DILOCO_LR, DILOCO_MOMENTUM):
        return None
    outer_steps = config.run.steps // optim.sync_every
    if outer_steps >= PAPER_OUTER_STEPS:
        return None
    return (f"geotrain: note: --sync-every {optim.sync_every}: outer Nesterov lr {DILOCO_LR:g}, momentum "
            f"{DILOCO_MOMENTUM:g} (DiLoCo's, made for {PAPER_OUTER_STEPS}+ outer steps); this run has {outer_steps}, "
            f"where they overshoot (bench wan, 12 outer steps: +0.25 nats). --outer-lr 1 --outer-momentum 0 "
            f"averages the replicas instead, as `plan --wan-recipe auto --recipe-steps N` chooses under "
            f"{PAPER_OUTER_STEPS} outer steps")


def async_validation_note(config: Any) -> str | None:
    """`--eval-every N` with asynchronous outer updates and no --eval-local: the ranks are at different steps, so
    the global model is scored at the end only (no mid-run collective); say so rather than give one row of N's."""
    data, optim = config.data, config.optim
    if optim.outer_sync == "sync" or not data.eval_every or data.eval_local or data.eval_every >= config.run.steps:
        return None
    return (f"geotrain: note: --eval-every {data.eval_every} with --outer-sync {optim.outer_sync}: the global model "
            f"is validated at the end only (the ranks are at different steps: no mid-run collective); --eval-local "
            f"also has each replica score the global model it gets back, every {data.eval_every} of its steps")
