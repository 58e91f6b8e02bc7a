"""Cost models by name. "yuan" is the default and the one the seed's tables use; "schedule" is `geotrain plan`'s
default on a cluster of mixed GPU types (MIXED_GPUS_COST_MODEL).

Every model is built from the cluster and a Traffic (cost/traffic.py), the compute-aware ones also
from per-device compute seconds; `build_cost_model` derives both from a Job (planning),
`build_traffic_model` takes measured traffic (prediction, runtime/predict.py).
"""

from __future__ import annotations

from geotrain.cluster import Cluster
from geotrain.cost.base import CostModel
from geotrain.cost.compute import YuanComputeCostModel
from geotrain.cost.dtfm import DtfmCostModel
from geotrain.cost.ring import RingCostModel
from geotrain.cost.schedule import ScheduleCostModel
from geotrain.cost.shards import Sharding
from geotrain.cost.traffic import Traffic
from geotrain.cost.yuan import YuanCostModel
from geotrain.errors import GeotrainError
from geotrain.job import Job


class CostModelError(GeotrainError, ValueError):
    """An unknown cost model or a model that cannot score this cluster/job."""


COST_MODELS: dict[str, type] = {
    "yuan": YuanCostModel,
    "ring": RingCostModel,
    "yuan+compute": YuanComputeCostModel,
    "dtfm": DtfmCostModel,
    "schedule": ScheduleCostModel,
}
"""Name -> model class; each has `for_job(cluster, job, stages, replicas)`."""

DEFAULT_COST_MODEL = "yuan"

MIXED_GPUS_COST_MODEL = "schedule"
"""`geotrain plan`'s default on a cluster of GPUs of more than one type, where a device's speed decides as much
as its links ("yuan" sees links only: it put a 1 x 3 layout on a site of L4s beside a site of H100s): the
event-simulated schedule (compute at each device's speed, links, overlap), the model auto-configuration ranks
with. With its default method (auto) the exact "yuan" search runs first and its finalists, some placed on the
fastest devices alone, are ranked by this model; other methods and --lower-bound keep DEFAULT_COST_MODEL (they
need its pairwise terms, or evaluate it fast). On GPUs of one type (the seed's clusters) and on a cluster
without GPU types, DEFAULT_COST_MODEL: every device computes alike there, and the exact search certifies."""

UNEVEN_SPLIT_MODELS = ("yuan+compute", "schedule")
"""Cost models that see compute, so take `layer_shares` (cost/layer_split.py: an uneven layer split)."""

TRAFFIC_MODELS = ("yuan", "ring", "dtfm")
"""Communication-only models: built from (cluster, traffic) alone."""


def build_cost_model(name: str, cluster: Cluster, job: Job, stages: int, replicas: int,
                     layer_shares: object = None, utilisation: float | None = None,
                     sharding: Sharding | None = None) -> CostModel:
    """Instantiate the cost model `name` for this cluster, job and (stages, replicas) layout;
    `layer_shares` (None: 1/S per stage; "speed"; S fractions) for the UNEVEN_SPLIT_MODELS only;
    `utilisation`: the fraction of each GPU's peak a step sustains, for the models that see compute (the
    UNEVEN_SPLIT_MODELS; None: DEFAULT_UTILISATION, or a calibration's: cost.calibration); `sharding`: `cluster`
    is a slot cluster of K devices per slot (cost/shards.py), whose compute and FSDP traffic the UNEVEN_SPLIT_MODELS
    price (the communication-only models see the slot cluster's links alone)."""
    if name not in COST_MODELS:
        raise CostModelError(f"unknown cost model {name!r} (known: {', '.join(sorted(COST_MODELS))})")
    compute = {} if utilisation is None or name not in UNEVEN_SPLIT_MODELS else {"utilisation": utilisation}
    if sharding is not None and sharding.k > 1 and name in UNEVEN_SPLIT_MODELS:
        compute["sharding"] = sharding
    if layer_shares is None:
        return COST_MODELS[name].for_job(cluster, job, stages, replicas, **compute)
    if name not in UNEVEN_SPLIT_MODELS:
        raise CostModelError(f"cost model {name!r} sees communication only, so a layer split does not change it; "
                             f"an uneven split needs one of {', '.join(UNEVEN_SPLIT_MODELS)}")
    return COST_MODELS[name].for_job(cluster, job, stages, replicas, layer_shares=layer_shares, **compute)


def build_traffic_model(name: str, cluster: Cluster, traffic: Traffic) -> CostModel:
    """The communication-only model `name` (one of TRAFFIC_MODELS) of `traffic` on `cluster`."""
    if name not in TRAFFIC_MODELS:
        raise CostModelError(f"cost model {name!r} needs compute; from traffic alone: {', '.join(TRAFFIC_MODELS)}")
    return COST_MODELS[name](cluster, traffic)
