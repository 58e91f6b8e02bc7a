"""Asynchronous DiLoCo priced (geotrain.sync.async_outer runs it, flat): seconds per step, each replica's compute
fraction and the staleness its updates carry; cost.wan_recipe.choose_local_steps weighs it against the synchronous
recipes.

Units: seconds, bytes, bit/s. c_r: replica r's compute seconds per inner step; H: inner steps per update; M_s: stage
s's fp32 parameter bytes (one stage: the model's); an update of stage s sends M_s up and gets M_s back (the runtime
sends no codec), twice that with moment sync (`moments`: the parameters then AdamW's second moments,
geotrain.sync.async_moments), in P fragments (`fragments`: P pushes per period of M_s / P each, every one a blocking
round trip). Stage s's server is in replica 0's stage-s process (member 0 of `links[s]`), so its own round trips cost
nothing; a replica of S stages pushes every stage at the same step and waits for the slowest stage's reply.

    B_s = 8 M_s (1 + moments)                                                  (bits of one update of stage s)
    X_rs = 0 (r = 0), else P (lat_s(r, 0) + lat_s(0, r)) + B_s / rate_s(r, 0) + B_s / rate_s(0, r)
    X_r = max_s X_rs                                                           (blocking round trips per period)
    p_r = H c_r + X_r                                                          (replica r's update period)
    server NIC: stage s's replies leave through its server's uplink, sum_{r != 0} B_s / p_r <= nic_s(0); beyond
                it every remote period stretches by the largest overload over the stages
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
The hierarchical variant is not priced. Fragments add P - 1 latency pairs per period and save no bytes: each one is
shorter to wait for, not the period (bench hetero measured equal bytes between regions with P 1 and 2). With K shards
per slot a slot is priced as one member carrying its stage's bytes (its K shards' pushes share the site's links).
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


def async_outer_price(replica_compute_s: float | Sequence[float], sync_every: int,
                      model_bytes: float | Sequence[float], links: GatherLinks | Sequence[GatherLinks],
                      staleness_bound: int, staleness_power: float = STALENESS_POWER, *, fragments: int = 1,
                      moments: bool = False) -> AsyncPrice:
    """The module doc's price for replicas computing `replica_compute_s` per inner step (member order of the links,
    each stage's server at member 0), H = `sync_every`, fp32 parameters of `model_bytes` (one number, or one per
    stage with one `links` per stage), the server's `staleness_power` P, `fragments` pushes per period and
    `moments` (second moments beside the parameters)."""
    compute = replica_seconds(replica_compute_s)
    replicas = compute.size
    stage_links = (links,) if not isinstance(links, Sequence) else tuple(links)
    stage_bytes = np.atleast_1d(np.asarray(model_bytes, dtype=np.float64))
    if len(stage_links) != stage_bytes.size or not stage_links:
        raise AsyncPriceError(f"async price: {stage_bytes.size} stages' model bytes but {len(stage_links)} stages' "
                              f"links")
    for stage in stage_links:
        if stage.members != replicas:
            raise AsyncPriceError(f"async price: {replicas} replicas' compute but {stage.members} members' links")
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise AsyncPriceError(f"async price: sync_every must be an integer >= 1, got {shown(sync_every)}")
    if not np.all(np.isfinite(stage_bytes)) or np.any(stage_bytes <= 0):
        raise AsyncPriceError(f"async price: model bytes must be finite numbers > 0, got {shown(model_bytes)}")
    if isinstance(staleness_bound, bool) or not isinstance(staleness_bound, int) or staleness_bound < 0:
        raise AsyncPriceError(f"async price: staleness bound must be an integer >= 0, got {shown(staleness_bound)}")
    if isinstance(fragments, bool) or not isinstance(fragments, int) or fragments < 1:
        raise AsyncPriceError(f"async price: fragments must be an integer >= 1, got {shown(fragments)}")
    stage_bits = 8.0 * stage_bytes * (2.0 if moments else 1.0)
    remote = np.arange(replicas) != 0
    trip = np.zeros(replicas)
    for stage, bits in zip(stage_links, stage_bits, strict=True):
        trip[remote] = np.maximum(trip[remote], fragments * (stage.latency_s[remote, 0] + stage.latency_s[0, remote])
                                  + bits / stage.rate_bps[remote, 0] + bits / stage.rate_bps[0, remote])
    period = sync_every * compute + trip
    if remote.any():  # each stage's server uplink carries its stage's remote replies
        overload = max(float(np.sum(bits / period[remote]) / stage.nic_bps[0])
                       for stage, bits in zip(stage_links, stage_bits, strict=True))
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
