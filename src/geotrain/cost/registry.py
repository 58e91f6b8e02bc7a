"""Cost models by name. "yuan" is the default and the one the seed's tables use."""

from __future__ import annotations

from collections.abc import Callable

from geotrain.cluster import Cluster
from geotrain.cost.base import CostModel
from geotrain.cost.compute import YuanComputeCostModel
from geotrain.cost.dtfm import DtfmCostModel
from geotrain.cost.ring import RingCostModel
from geotrain.cost.schedule import ScheduleCostModel
from geotrain.cost.yuan import YuanCostModel
from geotrain.errors import GeotrainError
from geotrain.job import Job


class CostModelError(GeotrainError, ValueError):
    """An unknown cost model or a model that cannot score this cluster/job."""


CostModelFactory = Callable[[Cluster, Job, int, int], CostModel]

COST_MODELS: dict[str, CostModelFactory] = {
    "yuan": YuanCostModel,
    "ring": RingCostModel,
    "yuan+compute": YuanComputeCostModel,
    "dtfm": DtfmCostModel,
    "schedule": ScheduleCostModel,
}

DEFAULT_COST_MODEL = "yuan"

UNEVEN_SPLIT_MODELS = ("yuan+compute", "schedule")
"""Cost models that see compute, so take `layer_shares` (cost/layer_split.py: an uneven layer split)."""


def build_cost_model(name: str, cluster: Cluster, job: Job, stages: int, replicas: int,
                     layer_shares: object = None) -> CostModel:
    """Instantiate the cost model `name` for this cluster, job and (stages, replicas) layout;
    `layer_shares` (None: 1/S per stage; "speed"; S fractions) for the UNEVEN_SPLIT_MODELS only."""
    if name not in COST_MODELS:
        raise CostModelError(f"unknown cost model {name!r} (known: {', '.join(sorted(COST_MODELS))})")
    if layer_shares is None:
        return COST_MODELS[name](cluster, job, stages, replicas)
    if name not in UNEVEN_SPLIT_MODELS:
        raise CostModelError(f"cost model {name!r} sees communication only, so a layer split does not change it; "
                             f"an uneven split needs one of {', '.join(UNEVEN_SPLIT_MODELS)}")
    return COST_MODELS[name](cluster, job, stages, replicas, layer_shares=layer_shares)
