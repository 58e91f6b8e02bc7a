"""`bench wan`'s torchft row: `torchft.local_sgd.DiLoCo`, unmodified, on the same links as geotrain's rows.

The bench starts torchft's Lighthouse (in this process: `torchft._torchft.LighthouseServer`, min
replicas = the row's replicas), one process per replica (geotrain.bench.wan_torchft_worker: a replica
group of one, its own store and Manager, torchft's DiLoCo around the loop), waits for them, shuts the
Lighthouse down (also on failure: nothing is left running), and scores the row like every other:
validation loss of replica 0's weights at the steps that end an outer period, time to target on the
emulated clock (per step, the slowest replica's), inter-region bytes as the emulator carried them
(torchft's all-reduce on each quorum's gloo group, emulated by geotrain.emulate.torchft_groups).
Row options: sync_every H, fragments P (torchft needs P | H), delay tau (torchft's
fragment_sync_delay), outer_lr, outer_momentum (Nesterov SGD per fragment), should_quantize (torchft's
flag; it needs Triton and CUDA, and on CPU sends fp32: the measured bytes say what was sent).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geotrain.cluster import Cluster, cluster_to_dict

TORCHFT_OPTIONS = {"sync_every": 5, "fragments": 1, "delay": 0, "outer_lr": 0.7, "outer_momentum": 0.9,
                   "should_quantize": False, "init_sync": False}
"""The torchft row's settings and their defaults (torchft's DiLoCo's: its examples use lr 0.7, momentum 0.9).
`init_sync`: the Manager's; False as torchft's docs advise when every replica initialises its weights
from one seed, as here (with True the first quorum heals every replica from one at step 0 and, measured
on wan-4x1, the first outer period's training is lost: validation loss at step 5 = the untrained 5.109
instead of 3.043)."""


def torchft_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The row's options over TORCHFT_OPTIONS; refuses unknown keys and P not dividing H (torchft's rule)."""
    from geotrain.bench.wan import WanBenchError

    unknown = sorted(set(options) - set(TORCHFT_OPTIONS))
    if unknown:
        raise WanBenchError(f"torchft row: unknown option(s) {', '.join(unknown)}; allowed: {', '.join(TORCHFT_OPTIONS)}")
    settings = {**TORCHFT_OPTIONS, **options}
    if settings["sync_every"] % settings["fragments"] or not 0 <= settings["delay"] < settings["sync_every"] // settings["fragments"]:
        raise WanBenchError(f"torchft row: fragments must divide sync_every and delay be < sync_every / fragments "
                            f"(torchft's DiLoCo), got H={settings['sync_every']}, P={settings['fragments']}, "
                            f"tau={settings['delay']}")
    return settings


def run_torchft_row(row: Any, cluster: Cluster, assignment: np.ndarray, config: Any, tokens: Any,
                    progress: Callable[[int, int], None] | None = None) -> Any:
    """Train `row` (engine "torchft") with torchft's DiLoCo on the replicas of `assignment` (one stage)."""
    # torchft's Rust logger reads RUST_LOG once, at import: its per-tick INFO lines would flood the bench's output
    os.environ.setdefault("RUST_LOG", "warn")
    from torchft._torchft import LighthouseServer

    from geotrain.bench.wan import WanBenchError, eval_steps_of, score_row
    from geotrain.models.evaluate import validation_loss
    from geotrain.procs import Command, Supervisor

    if assignment.shape[0] != 1:
        raise WanBenchError(f"torchft row: one stage only (torchft's DiLoCo is data parallel), got {assignment.shape[0]}")
    settings = torchft_settings(dict(row.options))
    devices = [int(d) for d in assignment[0]]
    replicas = len(devices)
    eval_steps = eval_steps_of(config, settings["sync_every"])
    seq_len = _seq_len(config)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=replicas, join_timeout_ms=100)
    try:
        with tempfile.TemporaryDirectory(prefix="geotrain-wan-torchft-") as directory:
            out = Path(directory)
            cfg_path = out / "config.json"
            cfg_path.write_text(json.dumps({
                **settings, "cluster": cluster_to_dict(cluster, "dense"), "devices": devices,
                "lighthouse": lighthouse.address(), "model": config.model, "seed": config.seed, "data_seed": 0,
                "seq_len": seq_len, "per_replica": config.global_batch // replicas, "steps": config.steps,
                "lr": config.lr, "time_scale": config.time_scale, "compute_clock": config.compute_clock,
                "eval_steps": eval_steps}))
            specs = [Command((sys.executable, "-m", "geotrain.bench.wan_torchft_worker", str(cfg_path), str(r)),
                             log=out / f"replica{r}.log") for r in range(replicas)]
            with Supervisor(specs, grace_s=5.0, term_s=2.0, timeout_s=1800.0) as supervisor:
                verdict = supervisor.wait()
            if not verdict.ok:
                tail = (out / f"replica{verdict.first_failed or 0}.log").read_text()[-1500:]
                raise WanBenchError(f"torchft row {row.label!r}: {verdict.message}\n{tail}")
            parts = [json.loads((out / f"records-{r}.json").read_text()) for r in range(replicas)]
            module = _tiny_module(config, tokens, seq_len)
            losses = []
            for step in eval_steps:
                module.load_state_dict(torch.load(out / f"step-{step}.pt"))
                losses.append(validation_loss([module], tokens.val.numpy(), seq_len, max_windows=config.val_windows))
            if progress is not None:
                progress(config.steps, config.steps)
    finally:
        lighthouse.shutdown()
    records = [record for part in parts for record in part["records"]]
    codec = "fp32 all-reduce" + (" (should_quantize: fp32 on CPU)" if settings["should_quantize"] else "")
    return score_row(row, assignment, {"dp": [codec], "pp": []}, eval_steps, losses, records, config)


def _seq_len(config: Any) -> int:
    from geotrain.bench.wan import _preset

    return int(_preset(config.model).context)


def _tiny_module(config: Any, tokens: Any, seq_len: int) -> Any:
    """The row's model as one stage (the worker's), to load its saved weights into."""
    from geotrain.models import MODEL_PRESETS, even_boundaries
    from geotrain.runtime.stages import build_layer_model, stage_modules

    model = build_layer_model(config.model, MODEL_PRESETS, config.seed, tokens.vocab_size, seq_len)
    return stage_modules(model, even_boundaries(model.n_layers, 1), [0])[0]
