"""`geotrain bench pipeline`: a 2-stage pipeline of the tiny GPT with its cut across a 100 Mbit/s link,
fp32 activations against each activation codec, and against the same pipeline inside one site.

The cluster: two sites of two devices (10 Gbit/s, 0.1 ms inside a site; 100 Mbit/s, 20 ms between),
emulated (geotrain.emulate). Every row trains the same model (seed), data and batch for the same steps
through the runtime (`geotrain train`'s launcher: one process per stage, one replica) and differs only
in the cut's codec (`--pp-codec`) and placement: "across" puts stage 1 in the other site, "local" in
the same site. Measured per row:
- cut bytes per step: activations forward plus their gradients back (2 x the runtime's bytes per cut),
  averaged over the run's steps (a delta cut's first sights travel wider: runtime/delta_wire.py);
- step seconds: the mean emulated step (compute on this CPU, in each rank's CPU seconds, so rows do
  not depend on how loaded the machine is; links as emulated);
- time to target: emulated seconds until the training loss, averaged over the last `smooth` steps,
  first reaches `target` nats (None when the steps end first);
- final loss: the validation loss (nats, held-out windows) after the last step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from geotrain.cluster import Cluster, make_network
from geotrain.errors import GeotrainError

INTER_GBPS = 0.1
INTER_MS = 20.0
ACROSS = ((0,), (2,))  # stage 0 in site A (devices 0, 1), stage 1 in site B (devices 2, 3)
LOCAL = ((0,), (1,))


class PipelineBenchError(GeotrainError, ValueError):
    """A bench setting that cannot be run (e.g. a codec --pp-codec refuses)."""


@dataclass(frozen=True)
class PipelineRow:
    """One bench row: a label, the cut's codec and whether the cut crosses the slow link."""

    label: str
    pp_codec: str
    across: bool = True


DEFAULT_ROWS = (
    PipelineRow("local, fp32", "none", across=False),
    PipelineRow("across, fp32", "none"),
    PipelineRow("across, int8-block", "int8-block"),
    PipelineRow("across, int4-block (block 32)", "int4-block:block_size=32"),
    PipelineRow("across, int4-block", "int4-block"),
    PipelineRow("across, int2-block", "int2-block"),
    PipelineRow("across, sign-block", "sign-block"),
)


@dataclass(frozen=True)
class PipelineBenchConfig:
    """The bench's settings (the CLI's flags)."""

    steps: int = 60
    target: float = 2.6
    smooth: int = 5
    time_scale: float = 1.0
    eval_windows: int = 32
    seed: int = 0
    rows: tuple[PipelineRow, ...] = DEFAULT_ROWS
    windows: str = "random"
    """How every row draws its training windows (geotrain.data.WINDOW_MODES; a delta codec needs "epochs")."""
    epoch_windows: int = 0
    """windows "epochs": the first N aligned windows only (0: all)."""


@dataclass(frozen=True)
class PipelineRowResult:
    label: str
    pp_codec: str
    across: bool
    cut_bytes_per_step: int
    bytes_ratio: float
    """fp32 cut bytes per step over this row's."""
    step_s: float
    time_to_target_s: float | None
    steps_to_target: int | None
    final_loss: float
    train_loss: float
    """The mean training loss of the last `smooth` steps."""
    losses: tuple[float, ...] = ()
    """The training loss of every step (JSON only)."""


@dataclass(frozen=True)
class PipelineBench:
    config: PipelineBenchConfig
    cluster: str
    rows: tuple[PipelineRowResult, ...]

    def to_json(self) -> dict[str, Any]:
        return {"config": {**asdict(self.config), "rows": [asdict(r) for r in self.config.rows]}, "cluster": self.cluster,
                "link": {"inter_gbps": INTER_GBPS, "inter_ms": INTER_MS}, "rows": [asdict(r) for r in self.rows]}


def bench_cluster() -> Cluster:
    """Two sites of two devices, 100 Mbit/s and 20 ms between them."""
    return make_network([2, 2], 10.0, (INTER_GBPS, INTER_GBPS), (INTER_MS, INTER_MS), seed=0, name="pipeline-2x2")


def steps_to_target(losses: list[float], target: float, smooth: int) -> int | None:
    """The first step count after which the mean of the last `smooth` losses is <= target (None: never)."""
    for end in range(smooth, len(losses) + 1):
        if float(np.mean(losses[end - smooth:end])) <= target:
            return end
    return None


def run_pipeline_bench(config: PipelineBenchConfig = PipelineBenchConfig(),
                       progress: Callable[[int, int], None] | None = None) -> PipelineBench:
    """Train every row and measure it (module docstring)."""
    from geotrain.data import world_tokens
    from geotrain.runtime import RuntimeConfig, launch

    cluster, tokens = bench_cluster(), world_tokens(0)
    found = []
    for i, row in enumerate(config.rows):
        run_config = RuntimeConfig.of(cluster=cluster, assignment=np.array(ACROSS if row.across else LOCAL),
                                      plan_name=row.label, steps=config.steps, pp_codec=row.pp_codec,
                                      time_scale=config.time_scale, compute_clock="cpu", seed=config.seed,
                                      eval_every=config.steps, eval_windows=config.eval_windows,
                                      windows=config.windows, epoch_windows=config.epoch_windows)
        report = launch(run_config, tokens=tokens).report
        cut_bytes = round(2 * report.pp_bytes_total / config.steps)
        losses = report.losses
        reached = steps_to_target(losses, config.target, config.smooth)
        found.append(PipelineRowResult(
            row.label, row.pp_codec, row.across, cut_bytes, 0.0, report.step_s,
            None if reached is None else reached * report.step_s, reached,
            float(report.validation[-1][1]) if report.validation else float("nan"),
            float(np.mean(losses[-config.smooth:])), tuple(float(x) for x in losses)))
        if progress is not None:
            progress(i + 1, len(config.rows))
    reference = next((r.cut_bytes_per_step for r in found if r.pp_codec == "none"), found[0].cut_bytes_per_step)
    rows = tuple(PipelineRowResult(**{**asdict(r), "bytes_ratio": reference / r.cut_bytes_per_step}) for r in found)
    return PipelineBench(config, cluster.name, rows)
