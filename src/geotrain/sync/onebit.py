"""1-bit Adam's synchronisation: OneBitAdam averages over the DP group itself (fp32 gradients in its
warm-up, error-compensated 1-bit momenta after), through a collective the transport times.

With --dp-hierarchical the optimizer is geotrain.optim.RegionOneBitAdam over a `RegionCollective` of the
group's regions (`timed_region_collective`): the gradient is averaged inside each region at full precision,
then 1-bit Adam runs with one worker per region, its fp32 warm-up all-reduce and its 1-bit messages crossing
regions once, sharded over the members. Every call (the region mean, the three between regions) is timed as one
collective of the hierarchy's groups; the step's bytes are what this rank sent, inside and between regions.

Clipping: the averaged gradient exists only during the warm-up, which is where OneBitAdam clips
(after the freeze its update is linear in the gradient: see geotrain.optim.onebit_adam); the norm is
reported only then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.comm import TorchCollective
from geotrain.comm.hierarchical import HierarchicalGroups
from geotrain.optim import OneBitAdam
from geotrain.optim.region_collective import RegionCollective
from geotrain.sync.base import CollectivePause, CollectiveTransport, GradientSync, StepTimer, SyncResult
from geotrain.sync.hierarchical import region_process_groups


class OneBitAdamSync(GradientSync):
    """Steps `optimizer` (which runs its own DP exchange on `collective`, whose calls run inside `pause()`:
    the compute timer counts the optimizer's work and leaves the collectives out). A step's bytes: what this rank
    handed to the group (a RegionCollective: what it sent, inside its region and between regions)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], optimizer: OneBitAdam,
                 collective: TorchCollective | RegionCollective, clip: float | None, pause: CollectivePause) -> None:
        self.params = list(params)
        self.optimizer = optimizer
        self.collective = collective
        self.clip = clip
        self.pause = pause

    def _sent_bytes(self) -> int:
        if isinstance(self.collective, RegionCollective):
            return self.collective.sent_bytes
        return self.collective.ledger.handed_bytes

    def step(self, step: int, timer: StepTimer) -> SyncResult:
        before = self._sent_bytes()
        warmup = not self.optimizer.frozen
        with self.pause.timing(timer):
            self.optimizer.step()
        norm = self.optimizer.last_grad_norm if warmup and self.clip is not None else None
        return SyncResult(self._sent_bytes() - before, norm)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "exchange": None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


def timed_region_collective(transport: CollectiveTransport, groups: HierarchicalGroups, rank: int,
                            group_devices: list[int], pause: CollectivePause) -> RegionCollective:
    """The regions of `groups` as 1-bit Adam's workers (rank-weighted: the mean over the group's ranks), each call
    run inside `pause()` through `transport.collective` on this rank's region group and the shard owners' groups
    (`group_devices`: the whole DP group's devices, what the record names)."""
    region = groups.regions.region_of(rank)
    process_groups = region_process_groups(groups, region)

    def wrap(nbytes: Callable[[], int], run: Callable[[], Any]) -> Any:
        with pause():
            return transport.collective(process_groups, group_devices, nbytes, run)

    return RegionCollective(groups, rank, rank_weighted=True, wrap=wrap)
