"""Asynchronous DiLoCo priced (geotrain.sync.async_outer runs it, flat): seconds per step, each replica's compute
fraction and the staleness its updates carry; cost.wan_recipe.choose_local_steps weighs it against the synchronous
recipes.

Units: seconds, bytes, bit/s. c_r: replica r's compute seconds per inner step; H: inner steps per update; M: the
model's fp32 bytes (an update sends M up and gets M back: the runtime sends no codec); the server is in replica 0's
process (member 0 of `links`), so its own round trip costs nothing.

    X_r = 0 (r = 0),  else 2 lat(r, 0) + 8 M / rate(r, 0) + 8 M / rate(0, r)    (blocking round trip)
    p_r = H c_r + X_r                                                          (replica r's update period)
    server NIC: the replies leave through replica 0's uplink, sum_{r != 0} 8 M / p_r <= nic_0; beyond it
                every remote period stretches by the overload
    staleness bound S: the slowest replica's update is not applied more than S updates stale, so the others'
                updates during its period, p_slow x sum_{j != slow} 1 / p_j, are capped at S by holding them
                (their periods stretch alike); S = 0 is synchronous DiLoCo (every p_r the slowest's, fresh)
    step_s = R / sum_r (H / p_r)             (seconds per R inner steps, one step of the equal schedule)
    fraction_r = H c_r / p_r
    s_r = p_r x sum_{j != r} 1 / p_j         (updates applied by the others while r computes: its staleness)
    staleness factor = sum_r (1 / p_r) / sum_r ((1 + s_r) ** -P / p_r)      (P: the staleness power)

The factor is what the outer optimizer itself discounts: delayed Nesterov scales an update s stale by
(1 + s) ** -P (geotrain.optim.delayed_nesterov), so per second the model takes that share of the fresh updates'
progress. It is a model of the optimizer's arithmetic, not a measured loss curve. With the default P = 0 (every
update at full weight) it is 1: on bench hetero at 1000 steps that run reached 0.7 nats sooner than adaptive
synchronous steps and ended 0.003 below equal ones (docs/history/async-staleness.md), so no discount is charged.
The hierarchical variant is not priced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from geotrain.cost.local_steps import replica_seconds
from geotrain.errors import GeotrainError, shown

if TYPE_CHECKING:
    from geotrain.comm.gather import GatherLinks

STALENESS_POWER = 0.0
"""Delayed Nesterov's default staleness weight (1 + s) ** -P, P = 0: every update at full weight, as the inner steps
it carries (geotrain.optim.delayed_nesterov applies it; its home is here, where it is priced). P = 0.5 (a gradient 3
updates stale counts half) was the default until bench hetero measured it: 0.05 nats worse at 1000 steps and 0.16
at 300 (docs/history/async-staleness.md)."""
STALENESS_BOUND = 8
"""Asynchronous DiLoCo's default bound on an update's staleness (global updates applied since its replica took
its model; geotrain.sync.async_server holds it, geotrain.sync.async_outer and DiLoCo default to it)."""


class AsyncPriceError(GeotrainError, ValueError):
    """Asynchronous settings that cannot be priced."""


@dataclass(frozen=True)
class AsyncPrice:
    """Asynchronous DiLoCo's predicted seconds per step and what each replica does (module doc)."""

    step_s: float
    period_s: tuple[float, ...]  # p_r: seconds between replica r's updates
    round_trip_s: tuple[float, ...]  # X_r: its blocking exchange with the server
    compute_fraction: tuple[float, ...]
    staleness: tuple[float, ...]  # s_r: updates applied by the others during r's period
    staleness_factor: float  # >= 1: time to a loss relative to fresh updates

    @property
    def charged_step_s(self) -> float:
        return self.step_s * self.staleness_factor


def async_outer_price(replica_compute_s: float | Sequence[float], sync_every: int, model_bytes: float,
                      links: GatherLinks, staleness_bound: int, staleness_power: float = STALENESS_POWER
                      ) -> AsyncPrice:
    """The module doc's price for replicas computing `replica_compute_s` per inner step (member order of `links`,
    the server at member 0), H = `sync_every`, an fp32 model of `model_bytes`, the server's `staleness_power` P."""
    compute = replica_seconds(replica_compute_s)
    replicas = compute.size
    if links.members != replicas:
        raise AsyncPriceError(f"async price: {replicas} replicas' compute but {links.members} members' links")
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise AsyncPriceError(f"async price: sync_every must be an integer >= 1, got {shown(sync_every)}")
    if not np.isfinite(model_bytes) or model_bytes <= 0:
        raise AsyncPriceError(f"async price: model bytes must be a finite number > 0, got {shown(model_bytes)}")
    if isinstance(staleness_bound, bool) or not isinstance(staleness_bound, int) or staleness_bound < 0:
        raise AsyncPriceError(f"async price: staleness bound must be an integer >= 0, got {shown(staleness_bound)}")
    bits = 8.0 * float(model_bytes)
    remote = np.arange(replicas) != 0
    trip = np.zeros(replicas)
    trip[remote] = (links.latency_s[remote, 0] + links.latency_s[0, remote]
                    + bits / links.rate_bps[remote, 0] + bits / links.rate_bps[0, remote])
    period = sync_every * compute + trip
    if remote.any():  # the server's uplink carries every remote reply
        overload = float(np.sum(bits / period[remote]) / links.nic_bps[0])
        if overload > 1.0:
            period[remote] *= overload
    if staleness_bound == 0:  # the runtime is then synchronous DiLoCo: every update waits for the slowest
        period = np.full(replicas, float(period.max()))
    elif replicas > 1:  # the bound holds the faster replicas while the slowest computes
        slow = int(np.argmax(period))
        others = np.arange(replicas) != slow
        during = period[slow] * float(np.sum(1.0 / period[others]))
        if during > staleness_bound:
            period[others] *= during / staleness_bound
    rate = 1.0 / period
    staleness = period * (rate.sum() - rate) if staleness_bound > 0 else np.zeros(replicas)
    weight = (1.0 + staleness) ** -staleness_power
    step_s = replicas / float(np.sum(sync_every * rate))
    return AsyncPrice(step_s, tuple(float(p) for p in period), tuple(float(x) for x in trip),
                      tuple(float(f) for f in sync_every * compute / period), tuple(float(s) for s in staleness),
                      float(rate.sum() / np.sum(weight * rate)))
