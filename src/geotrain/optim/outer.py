"""Local SGD with outer steps (DiLoCo, Douillard et al. 2023): synchronise replicas every H steps.

Every replica keeps the *anchor*, the parameters all replicas agreed on at the last synchronisation,
and runs its inner optimizer (AdamW) on its own gradients for H steps without communicating. At a
synchronisation the replicas average the *outer gradient* (the parameter delta, anchor - local
parameters, one value per parameter) through a reducer of the DP group (so the exchange can be
compressed, with error feedback, or hierarchical), and an outer optimizer steps the anchor with it:

    delta_r = anchor - theta_r                         (replica r, after its H inner steps)
    anchor  = OuterSGD(anchor, mean_r delta_r)         (torch.optim.SGD: lr, momentum, Nesterov)
    theta_r = anchor                                   (every replica continues from the new anchor)

DiLoCo's setting is lr 0.7, momentum 0.9, Nesterov. With lr 1 and momentum 0 the outer step is plain
parameter averaging, anchor = mean_r theta_r (local SGD / "model averaging"); with H = 1 besides, that
is: every step each replica takes one inner step from the common parameters on its own gradient and
the new parameters are the replicas' mean (tests/integration/optim/test_outer_step.py holds both to a reference).

Communication: one exchange of the parameter count every H steps instead of every step. The inner
optimizer's state (AdamW moments) stays local to each replica.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from geotrain.errors import GeotrainError
from geotrain.optim.outer_state import check_outer_state, on_state, state_copy
from geotrain.optim.shards import local_shard

DILOCO_LR = 0.7
DILOCO_MOMENTUM = 0.9
LANDINGS = ("mix", "eager")
"""How a sync that lands late (Streaming DiLoCo's delay tau > 0) meets the local parameters
(geotrain.sync.streaming): "mix" (alpha x local + (1 - alpha) x new anchor) or "eager" (Kale et al.
2025: the local outer gradient stands in for the mean at once, the correction lands later)."""


class OuterStepError(GeotrainError, ValueError):
    """An invalid outer-step setting (named with its value)."""


def check_outer_settings(sync_every: Any, lr: Any, momentum: Any, source: str = "OuterStep",
                         section: str | None = None) -> None:
    """Raise OuterStepError unless sync_every is an integer >= 1, lr finite > 0, momentum in [0, 1). The message
    names the setting as `source: key`, or as `section.key` with a config `section` (the CLI writes such a key
    as the flag the user typed)."""
    def where(key: str) -> str:
        return f"{source}: {key}" if section is None else f"{section}.{key}"

    if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
        raise OuterStepError(f"{where('sync_every')} must be an integer >= 1, got {sync_every!r}")
    for name, value, ok in (("outer_lr", lr, lambda v: v > 0), ("outer_momentum", momentum, lambda v: 0 <= v < 1)):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or not ok(value):
            bound = "> 0" if name == "outer_lr" else "in [0, 1)"
            raise OuterStepError(f"{where(name)} must be a finite number {bound}, got {value!r}")


class OuterStep:
    """The anchor of `params` and the outer optimizer stepping it (see module doc).

    `due(step, total_steps)`: whether 0-based `step` ends an outer period (every `sync_every` steps,
    and the run's last step). Per synchronisation: `outer_gradients()` -> exchange their mean over the
    DP group -> `apply(means)`. Sharded parameters (DTensor: FSDP2): the anchor, its momentum and the outer
    gradients are the local shard's (geotrain.optim.shards.local_shard, read at each use). `outer_state`: where the
    anchor, its momentum and the outer gradients live, "device" (the parameters') or "host" (geotrain.optim.outer_state:
    each parameter copied to the host on its own when read, the new values written back tensor by tensor).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], sync_every: int, lr: float = DILOCO_LR,
                 momentum: float = DILOCO_MOMENTUM, outer_state: str = "device") -> None:
        check_outer_settings(sync_every, lr, momentum)
        try:
            self.outer_state = check_outer_state(outer_state, "OuterStep: outer_state")
        except ValueError as exc:
            raise OuterStepError(str(exc)) from None
        self.params = list(params)
        self.sync_every = sync_every
        self.anchor = [torch.nn.Parameter(state_copy(p, outer_state)) for p in self.params]
        self.optimizer = torch.optim.SGD(self.anchor, lr=lr, momentum=momentum, nesterov=momentum > 0)

    def due(self, step: int, total_steps: int) -> bool:
        """True if 0-based `step` ends an outer period: every sync_every steps, and the last step."""
        return (step + 1) % self.sync_every == 0 or step + 1 == total_steps

    def outer_gradients(self) -> list[torch.Tensor]:
        """This replica's outer gradient per parameter: anchor - local parameters (fp32, where the anchor lives)."""
        return [(a.detach() - on_state(p, self.outer_state).float()) for a, p in zip(self.anchor, self.params,
                                                                                      strict=True)]

    def apply(self, means: Sequence[torch.Tensor]) -> None:
        """Step the anchor with the replicas' mean outer gradient and reset the local parameters to it."""
        self.step_anchor(means)
        self.reset_params()

    def step_anchor(self, means: Sequence[torch.Tensor]) -> None:
        """Step the anchor with the replicas' mean outer gradient (the local parameters are not touched)."""
        if len(means) != len(self.anchor):
            raise ValueError(f"expected {len(self.anchor)} mean outer gradients, got {len(means)}")
        for anchor, mean in zip(self.anchor, means, strict=True):
            anchor.grad = mean.detach().reshape(anchor.shape).to(anchor.device, torch.float32, copy=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def proxy_change(self, gradients: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The anchor change an outer step with `gradients` in place of the mean would make (eager
        landing: this replica's own outer gradient as the proxy of the replicas' mean); the anchor and
        the outer optimizer's state (momentum) are left as they were."""
        saved_anchor = [a.detach().clone() for a in self.anchor]
        saved_state = copy.deepcopy(self.optimizer.state_dict())
        self.step_anchor(gradients)
        change = [a.detach() - saved for a, saved in zip(self.anchor, saved_anchor, strict=True)]
        with torch.no_grad():
            for anchor, saved in zip(self.anchor, saved_anchor, strict=True):
                anchor.copy_(saved)
        self.optimizer.load_state_dict(saved_state)
        return change

    def start_eager(self, gradients: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Eager landing's start: local parameters = anchor + the proxy change of `gradients` (this
        replica's outer gradient, as if it were the mean); returns that change for `land_eager`."""
        proxy = self.proxy_change(gradients)
        with torch.no_grad():
            for p, anchor, change in zip(self.params, self.anchor, proxy, strict=True):
                local_shard(p).copy_((anchor + change).to(p.dtype))
        return proxy

    def land_eager(self, means: Sequence[torch.Tensor], proxy: Sequence[torch.Tensor]) -> None:
        """Eager landing's end: step the anchor with the replicas' mean and move the local parameters by
        the correction (the anchor's true change - the proxy change applied at the start), which keeps
        the local progress of the steps run meanwhile."""
        before = [a.detach().clone() for a in self.anchor]
        self.step_anchor(means)
        with torch.no_grad():
            for p, anchor, old, change in zip(self.params, self.anchor, before, proxy, strict=True):
                local = local_shard(p)
                local.add_((anchor.detach() - old - change).to(local.device, p.dtype))

    def land(self, means: Sequence[torch.Tensor], proxy: Sequence[torch.Tensor] | None, mix: float = 0.0) -> None:
        """A late sync lands: eagerly (`proxy`: the change applied when it started; land_eager), else the anchor
        steps with the replicas' mean and the local parameters mix toward it (Streaming DiLoCo's mix)."""
        if proxy is not None:
            self.land_eager(means, proxy)
            return
        self.step_anchor(means)
        self.reset_params(mix)

    def reset_params(self, mix: float = 0.0) -> None:
        """Local parameters = mix x local + (1 - mix) x anchor (mix 0: the anchor; Streaming DiLoCo's
        mixing of the local and the global fragment when the sync lands some steps late)."""
        with torch.no_grad():
            for p, anchor in zip(self.params, self.anchor, strict=True):
                local = local_shard(p)
                if mix == 0.0:
                    local.copy_(anchor.to(p.dtype))
                else:
                    local.copy_(torch.lerp(anchor, on_state(p, self.outer_state).float(), mix).to(p.dtype))

    def anchor_sum(self) -> float:
        """A fingerprint of the anchor (float64 sum): every replica's is the same after each synchronisation."""
        return float(sum(a.detach().double().sum() for a in self.anchor))

    def state_dict(self) -> dict[str, Any]:
        return {"anchor": [a.detach().clone() for a in self.anchor], "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        anchors = state["anchor"]
        if len(anchors) != len(self.anchor) or any(a.shape != b.shape for a, b in zip(anchors, self.anchor, strict=True)):
            raise ValueError("checkpoint's outer-step anchor does not match this stage's parameters")
        with torch.no_grad():
            for anchor, saved in zip(self.anchor, anchors, strict=True):
                anchor.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
