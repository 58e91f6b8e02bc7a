"""`geotrain plan --shards K|auto`: sharded replicas on a fixed layout (slots placed site by site, cost.shards) and
the flag auto-configuration reads (search.autoconfig chooses K)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.compute import YuanComputeCostModel
from geotrain.cost.shards import MAX_SHARDS, ShardError, Sharding, check_shards, group_slots
from geotrain.errors import GeotrainError
from geotrain.job import Job
from geotrain.search.autoconfig import SHARDS_ALWAYS


def add_shards_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shards", type=shard_count, default=None, metavar="K|auto",
                        help="sharded replicas: each (stage, replica) slot is K devices of one site holding FSDP2 "
                             "shards of its stage (the plan's \"shards\" object); not given: 1 for a fixed layout, "
                             "and for auto-configuration 1 where a layout fits one device per slot, else the fastest "
                             "K; auto (auto-configuration only): K = 1 and every power of two up to the largest "
                             "site weighed together")


def sharded_compute_s(slots: Cluster, job: Job, assignment: np.ndarray, sharding: Sharding,
                      utilisation: float | None) -> float:
    """The slowest replica's compute seconds per step on the slot cluster `slots` by "yuan+compute" (each slot's
    compute over its K devices plus FSDP's traffic inside it): a sharded layout's recipe is priced with it."""
    stages, replicas = (int(n) for n in np.shape(assignment))
    model = YuanComputeCostModel.for_job(slots, job, stages, replicas, sharding=sharding,
                                         **({} if utilisation is None else {"utilisation": utilisation}))
    return float(model.replica_compute_seconds(np.asarray(assignment)[None]).max())


def shard_count(text: str) -> int:
    """--shards K: an integer in 1..MAX_SHARDS, or "auto" (SHARDS_ALWAYS: auto-configuration weighs every K)."""
    if text == "auto":
        return SHARDS_ALWAYS
    try:
        return check_shards(int(text))
    except (ValueError, ShardError):
        raise argparse.ArgumentTypeError(f"must be an integer in 1..{MAX_SHARDS} (devices of one site per slot) "
                                         f"or auto, got {text!r}") from None


def shard_slots(args: Any, cluster: Cluster) -> tuple[np.ndarray, Sharding]:
    """The slots of --shards K on `cluster` (cost.shards.group_slots: each site's devices K at a time, fastest
    first) and their Sharding; one line when the sites hold fewer than S x R slots, or with --uneven-split."""
    if args.uneven_split:
        raise GeotrainError("--uneven-split with --shards: not yet (the speed split of sharded slots is not priced)")
    slots = group_slots(cluster, args.shards)
    need = args.stages * args.replicas
    if len(slots) < need:
        sites = ", ".join(f"{name} {size}" for name, size in zip(cluster.region_names, cluster.region_sizes()))
        raise GeotrainError(f"--shards {args.shards}: --stages {args.stages} x --replicas {args.replicas} need {need} "
                            f"slots of {args.shards} devices of one site, and the sites hold {len(slots)} "
                            f"(devices per site: {sites}); use fewer shards, stages or replicas")
    return slots, Sharding.of_slots(cluster, slots)
