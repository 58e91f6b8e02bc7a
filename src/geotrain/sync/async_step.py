"""Asynchronous DiLoCo in `geotrain train` (`--outer-sync async|async-hierarchical`): the GradientSync
around geotrain.sync.async_outer, and the run settings it refuses (one line each, with the reason).

Each rank steps AdamW on its own gradients; every H inner steps it sends its outer gradient to the global
model's server and goes on from the model it gets back. Ranks therefore run different numbers of steps:
the run ends when the global model holds `target_updates` outer gradients (ceil(steps / H) per replica:
the synchronous run's budget of inner steps, whichever replicas took them), and `finish()` leaves every
rank with the final global model. Validation runs once, after it (before, ranks are at different steps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from geotrain.sync.async_outer import AsyncOuterSync
from geotrain.sync.base import GradientSync, StepTimer, SyncError, SyncResult


class AsyncOuterGradientSync(GradientSync):
    """Inner AdamW steps; every H of them an asynchronous outer update (module doc)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                 outer: AsyncOuterSync, total_steps: int, replicas: int) -> None:
        self.params = list(params)
        self.optimizer = optimizer
        self.outer = outer
        self.target_updates = replicas * math.ceil(total_steps / outer.sync_every)

    @property
    def done(self) -> bool:
        """The global model holds the run's budget of outer gradients: stop taking inner steps."""
        return self.outer.outer_step >= self.target_updates

    def step(self, step: int, timer: StepTimer) -> SyncResult:
        with timer:
            self.optimizer.step()
        before = self.outer.bytes_sent
        self.outer.after_inner_step()
        return SyncResult(self.outer.bytes_sent - before, None)

    def finish(self) -> int:
        """The final exchange (waits for every rank); bytes it put on links."""
        before = self.outer.bytes_sent
        self.outer.finish()
        return self.outer.bytes_sent - before

    def fingerprint(self) -> float:
        """The global model this rank last received (ranks differ until the end: asynchronous)."""
        return self.outer.fingerprint()

    def state_dict(self) -> dict[str, Any]:
        raise SyncError("asynchronous outer updates do not checkpoint: the global model lives in rank 0's server")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise SyncError("asynchronous outer updates do not resume from a checkpoint")


def check_async_run(outer_sync: str, *, pipeline_stages: int, time_scale: float, elastic: bool,
                    checkpoint_dir: str | None, dp_hierarchical: bool) -> str | None:
    """Why (one line) a run setting does not combine with `--outer-sync async*`; None if all do."""
    if outer_sync == "sync":
        return None
    refusals = ((pipeline_stages > 1, f"needs one stage per replica (the whole model), the plan has {pipeline_stages}"),
                (time_scale > 0, "does not run on emulated links (the server threads would advance a rank's one "
                                 "emulated clock); pass --time-scale 0 (a plan's recipe: or plan with "
                                 "--recipe-outer-sync sync)"),
                (elastic, "does not combine with --elastic: the global model lives once, in rank 0's server, and "
                          "a torchft recovery copies a peer's state at a synchronous step"),
                (checkpoint_dir is not None, "does not checkpoint (the global model lives in rank 0's server)"),
                (dp_hierarchical, "takes its regions from the cluster itself (async-hierarchical); drop "
                                  "--dp-hierarchical"))
    return next((f"--outer-sync {outer_sync} {why}" for refused, why in refusals if refused), None)
