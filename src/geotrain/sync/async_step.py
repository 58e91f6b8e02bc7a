"""Asynchronous DiLoCo in `geotrain train` (`--outer-sync async|async-hierarchical`): the GradientSync
around geotrain.sync.async_outer (the run settings it does not combine with: runtime/composition.py).

Each rank steps AdamW on its own gradients; every H inner steps it sends its outer gradient to the global
model's server and goes on from the model it gets back. Ranks therefore run different numbers of steps:
the run ends when the global model holds `target_updates` outer gradients (ceil(steps / H) per replica:
the synchronous run's budget of inner steps, whichever replicas took them), and `finish()` leaves every
rank with the final global model. Validation runs after it; with `eval_local` also after each of this rank's
updates at the evaluation cadence, on the global model just received (ranks are at different steps: a
validation that needs a collective can only run at the end). Checkpoints are written in checkpoint rounds
(sync/async_server.py: every rank paused at a period's start, none waiting) named by the equal schedule's step
the global model reached, and at the end (the final global model on every rank, not resumed from).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from geotrain.sync.async_outer import AsyncOuterSync
from geotrain.sync.base import GradientSync, StepTimer, SyncError, SyncResult


def run_budget(total_steps: int, sync_every: int, replicas: int) -> int:
    """The replica outer gradients of a run of `total_steps` (the synchronous run's: ceil(steps / H) per replica)."""
    return replicas * math.ceil(total_steps / sync_every)


def progress_steps(updates: int, sync_every: int, replicas: int) -> int:
    """The run's progress in steps of the equal schedule (R replicas x 1 inner step each) of a global model holding
    `updates` replica outer gradients (H inner steps each): updates x H // R (run_budget's inverse)."""
    return updates * sync_every // replicas


def pause_updates(step: int, sync_every: int, replicas: int) -> int:
    """The replica outer gradients at which the global model reaches the equal schedule's `step` (a checkpoint's, a
    --stop-after's): ceil(step x R / H), the least count progress_steps maps to `step` or later."""
    return -(-step * replicas // sync_every)


class AsyncOuterGradientSync(GradientSync):
    """Inner AdamW steps; every H of them an asynchronous outer update (module doc)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                 outer: AsyncOuterSync) -> None:
        if outer.budget is None:
            raise SyncError("asynchronous outer updates in a run need the run's budget (AsyncOuterSync(budget=))")
        self.params = list(params)
        self.optimizer = optimizer
        self.outer = outer
        self.target_updates = outer.budget
        """The run's budget (run_budget), which the global model's server also caps its updates at."""

    @property
    def done(self) -> bool:
        """The global model holds the run's budget of outer gradients: stop taking inner steps."""
        return self.outer.outer_step >= self.target_updates

    def evaluates_now(self, pushes_before: int, eval_every: int) -> bool:
        """Whether this rank scores the global model it just received: the last step sent its outer gradient
        (`pushes_before`: the count before it) and this rank's inner steps so far are a multiple of `eval_every`
        (0: never mid-run)."""
        pushes = self.outer.pushes
        return bool(eval_every) and pushes > pushes_before and (pushes * self.outer.sync_every) % eval_every == 0

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

    def paused_for(self) -> int | None:
        """The checkpoint this rank was paused for and must write now (the equal schedule's step), once; else None."""
        step, self.outer.paused_for = self.outer.paused_for, None
        return step

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer and this rank's side of the global model (rank 0: the server's state too); written at
        a checkpoint round (sync/async_server.py) or at the end (the final global model on every rank)."""
        return {"optimizer": self.optimizer.state_dict(), "finished": self.outer.finished,
                "asynchronous": self.outer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "asynchronous" not in state:
            raise ValueError("checkpoint holds no asynchronous outer updates")
        if state["asynchronous"].get("elastic") and not state["finished"]:
            raise ValueError("an elastic asynchronous run's checkpoint holds one copy of the global model, not each "
                             "rank's place nor the server's clients; resume it with --elastic")
        if "anchor" not in state["asynchronous"]:
            raise ValueError("checkpoint holds no asynchronous outer updates")
        if state["finished"]:
            raise ValueError("the asynchronous run ended in this checkpoint (its final exchange is done)")
        self.optimizer.load_state_dict(state["optimizer"])
        self.outer.load_state_dict(state["asynchronous"])
