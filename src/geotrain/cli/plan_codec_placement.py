"""`plan --codecs auto` on a fixed layout: the placement chosen together with the activation codecs.

The search prices uncompressed activations, so it keeps pipeline cuts off slow links; with a 4-bit activation
codec a cut across a slow link can cost less than a data-parallel group across it. So the placement is searched
twice with the same method and seed: for the job's own bytes, and for the bytes of the policy's lowest
activation rung on every cut (the DP exchange native: each group's DP codec is chosen after, per group). Each
placement gets its codecs (geotrain.cost.codec_choice.choose_codecs) and the one whose total with codecs is
lower wins (ties: the first). Without --time-limit and --lower-bound only: a second search would take a
budget's time twice, and a bound certifies the uncompressed optimum, not a placement searched for other bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from geotrain.cluster import Cluster
from geotrain.cost.codec_choice import CodecChoice, CodecPolicy, choose_codecs, codec_link_bytes
from geotrain.cost.traffic import traffic_of_job
from geotrain.cost.yuan import YuanCostModel
from geotrain.job import Job
from geotrain.search import SearchResult


@dataclass(frozen=True)
class CodecPlacement:
    """The placement kept (`result`, its cost by the uncompressed model), its codecs, and the predicted seconds
    with codecs of each placement tried ("searched uncompressed", "searched for <codec> activations")."""

    result: SearchResult
    choice: CodecChoice
    tried: dict[str, float]

    @property
    def kept(self) -> str:
        """The name of the placement kept: the fastest with its codecs (ties: the first tried)."""
        return min(self.tried, key=self.tried.__getitem__)

    def line(self) -> str:
        """One sentence for the plan's explanation: which placement was kept, with codecs, against the other."""
        kept = self.kept
        others = "; ".join(f"{name}: {total:.4g} s" for name, total in self.tried.items() if name != kept)
        return (f"Codecs: the placement {kept} is kept, {self.tried[kept]:.4g} s per iteration with its codecs "
                f"({others} with its own; the seconds above are without codecs).")

    def to_json(self) -> dict[str, Any]:
        """The plan's codecs object's "placement" entry."""
        return {"tried": self.tried, "kept": self.kept}


def activation_codec_model(cluster: Cluster, job: Job, stages: int, replicas: int, pp_codec: str) -> YuanCostModel:
    """The "yuan" model of `job` whose pipeline cuts carry `pp_codec`'s bytes (the DP exchange native)."""
    wire = codec_link_bytes(pp_codec, job, "pp")  # the pipeline's bytes per value; the DP fields unset (native)
    return YuanCostModel(cluster, traffic_of_job(job, stages, replicas, wire=wire))


def place_with_codecs(cluster: Cluster, job: Job, result: SearchResult, policy: CodecPolicy,
                      search: Callable[[YuanCostModel], SearchResult], evaluate: Callable[[Any], Any]) -> CodecPlacement:
    """`result` (searched uncompressed) against a placement searched by `search` for the policy's lowest
    activation rung (module docstring); `evaluate(assignment)`: the uncompressed model's CostBreakdown."""
    first = choose_codecs(cluster, job, result.assignment, policy)
    tried = {"searched uncompressed": first.cost["total"]}
    stages, replicas = result.assignment.shape
    if stages < 2 or codec_link_bytes(policy.pp, job, "pp").pp_inter >= job.bytes_per_value:
        return CodecPlacement(result, first, tried)  # no cut, or the lowest rung sends the native bytes
    other = search(activation_codec_model(cluster, job, stages, replicas, policy.pp))
    second = choose_codecs(cluster, job, other.assignment, policy)
    tried[f"searched for {policy.pp} activations"] = second.cost["total"]
    if second.cost["total"] >= first.cost["total"]:
        return CodecPlacement(result, first, tried)
    kept = replace(other, cost=evaluate(other.assignment), lower_bound=None,
                   details={**other.details, "placed_for_codecs": policy.pp})
    return CodecPlacement(kept, second, tried)
