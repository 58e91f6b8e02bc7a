"""Codec choice per DP group (stage) and per pipeline cut: compress only where the links make it pay.

The quality ladders, best quality first (each step down sends fewer bytes and risks more quality):
    DP exchange:  none > fp16 > int8-block > powersgd > sign        (sign: 1 bit per value + error feedback)
    activations:  none > fp16 > int8-block > int4-block
                  (the runtime's pipeline codecs, activations and their gradients alike: a cast, or a codec's
                  packed bytes in a float32 carrier, runtime/cut_wire.py; 4, 2, 1.02, 0.53 bytes per value.
                  int2-block and sign-block run too, but stalled the tiny GPT in bench pipeline: not a rung;
                  per-sample deltas, `delta:...`, are priced by their steady-state bytes, codecs/delta.py, but
                  are no rung either: they need revisited samples, --windows epochs, which a plan does not know)
A policy (`dp=sign,pp=fp16`) names the lowest rung each may use; the default stops at
int8-block for DP and fp16 for activations (measured: sign+EF under AdamW costs ~0.5 nats on the tiny GPT,
docs/history/wan.md; the activation codecs' losses: docs/results/bench-pipeline.md).

Wire bytes per value come from the codecs' own documented sizes (`Codec.bytes_per_value`): none = the
job's bytes_per_value, fp16 = min(2, that), int8-block = 1 + 4/256, sign = 1/8, powersgd (rank r) on the
job's dominant hidden x 4 hidden matrices = 4 r (h + 4h) / (4 h^2). Whether a reducer's payloads are
all-gathered and its latency rounds are the reducer's traits (`geotrain.comm.reducer_traits`): codecs
whose payloads cannot be summed in compressed form (int8, int8-block, topk, sign) are all-gathered:
each member receives every other member's whole payload, (n - 1) b bytes instead of a scatter-gather's
2 (n - 1) / n b, so their DP bytes per value count n / 2 times, and in (n - 1) latency rounds instead
of 2 (n - 1): half the latency. PowerSGD runs two all-reduces (P, Q): twice the latency.

The rule (`choose_codecs`), with the "yuan" model and these bytes:
1. every group and cut gets its fastest allowed codec (ties: the better-quality one): total T*;
2. then, stage by stage and cut by cut, each is moved up the ladder to the best-quality codec that
   keeps the predicted total within (1 + tolerance) T*, given the choices made so far.
So a group whose links are fast, or that is not the bottleneck (dp = max over stages, pp = max over
replicas), keeps full precision: compression is spent only where it shortens the iteration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cost.traffic import WireBytes, traffic_of_job
from geotrain.cost.yuan import YuanCostModel
from geotrain.errors import GeotrainError, shown
from geotrain.job import Job

DP_LADDER = ("none", "fp16", "int8-block", "powersgd", "sign")
PP_LADDER = ("none", "fp16", "int8-block", "int4-block")
DEFAULT_POLICY = "dp=int8-block,pp=fp16"  # sign+EF with AdamW lost 0.5 nats in bench wan (docs/history/wan.md)
DEFAULT_TOLERANCE = 0.02


class CodecPolicyError(GeotrainError, ValueError):
    """A codec policy or tolerance that cannot be read."""


@dataclass(frozen=True)
class CodecPolicy:
    """The lowest ladder rung allowed for the DP exchange and for activations; `tolerance` the
    fraction of predicted time the choice may give up for better quality."""

    dp: str = "int8-block"
    pp: str = "fp16"
    tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self) -> None:
        if self.dp not in DP_LADDER:
            raise CodecPolicyError(f"--codec-policy dp: must be one of {', '.join(DP_LADDER)}, got {shown(self.dp)}")
        if self.pp not in PP_LADDER:
            raise CodecPolicyError(f"--codec-policy pp: must be one of {', '.join(PP_LADDER)}, got {shown(self.pp)}")
        if isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float)) \
                or not 0 <= self.tolerance <= 10:
            raise CodecPolicyError(f"--codec-tolerance: must be a number in 0..10, got {shown(self.tolerance)}")

    @property
    def dp_allowed(self) -> tuple[str, ...]:
        return DP_LADDER[: DP_LADDER.index(self.dp) + 1]

    @property
    def pp_allowed(self) -> tuple[str, ...]:
        return PP_LADDER[: PP_LADDER.index(self.pp) + 1]

    def text(self) -> str:
        return f"dp={self.dp},pp={self.pp}"


def parse_codec_policy(text: str, tolerance: float = DEFAULT_TOLERANCE, source: str = "--codec-policy") -> CodecPolicy:
    """`dp=RUNG,pp=RUNG` (either part optional; the other keeps its default) into a CodecPolicy."""
    values: dict[str, str] = {}
    for item in filter(str.strip, str(text).split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in ("dp", "pp"):
            raise CodecPolicyError(f"{source}: items must be dp=CODEC or pp=CODEC, got {shown(item.strip())}")
        if key in values:
            raise CodecPolicyError(f"{source}: {key} given twice in {shown(text)}")
        values[key] = value.strip()
    return CodecPolicy(tolerance=tolerance, **values)


def codec_link_bytes(name: str, job: Job, kind: str, group_size: int = 2) -> WireBytes:
    """WireBytes of a flat codec spec `name` (both link classes alike) for `kind` "dp" or "pp" of `job`;
    `group_size` n: the DP group's members (all-gathered codecs count n / 2 times)."""
    from geotrain.codecs import CodecSpec  # torch-backed: imported only when codecs are priced
    from geotrain.codecs.carrier import cut_bytes_per_value
    from geotrain.codecs.delta import DeltaSpec, is_delta
    from geotrain.comm import reducer_traits

    spec, sample = CodecSpec.parse(name), (job.seq_len, job.hidden)
    if kind == "pp" and is_delta(spec):  # per-sample deltas: priced by the steady state (every sample seen)
        return WireBytes.uniform(pp=DeltaSpec.of(spec).steady_bytes_per_value(sample, job.bytes_per_value))
    if kind == "pp":  # one sample's [seq, hidden] activations (a low-rank codec: by that matrix)
        return WireBytes.uniform(pp=cut_bytes_per_value(spec.build(), sample, job.bytes_per_value))
    per_value = spec.build().bytes_per_value(job.hidden, job.bytes_per_value)
    traits = reducer_traits(spec)
    if traits.gathered:  # all-gather: n/2 times the bytes, half the latency rounds of an all-reduce
        return WireBytes.uniform(dp=per_value * max(1.0, group_size / 2), dp_latency_rounds=0.5 * traits.latency_rounds)
    return WireBytes.uniform(dp=per_value, dp_latency_rounds=traits.latency_rounds)


@dataclass(frozen=True)
class CodecChoice:
    """Per-stage DP codecs and per-cut activation codecs, and predicted seconds with and without them."""

    policy: CodecPolicy
    dp: tuple[str, ...]
    pp: tuple[str, ...]
    cost: dict[str, float]
    uncompressed: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        """The plan file's "codecs" object (read back by geotrain.plan.plan_codecs)."""
        return {"version": 1, "policy": self.policy.text(), "tolerance": self.policy.tolerance,
                "dp": list(self.dp), "pp": list(self.pp), "cost": self.cost, "uncompressed": self.uncompressed}


def _total(dp_table: np.ndarray, pp_table: np.ndarray, dp_pick: Sequence[int], pp_pick: Sequence[int]) -> tuple[float, float]:
    """(dp, pp) seconds: dp_table (codecs, S), pp_table (codecs, S-1, R); picks index the codecs."""
    stages = np.arange(dp_table.shape[1])
    dp = float(dp_table[list(dp_pick), stages].max()) if len(stages) else 0.0
    if pp_table.shape[1] == 0:
        return dp, 0.0
    cuts = np.arange(pp_table.shape[1])
    return dp, float(pp_table[list(pp_pick), cuts, :].sum(axis=0).max())


def _relax(picks: list[int], best: Sequence[int], index: int, fits: Any) -> None:
    """Move picks[index] to the best-quality rung (lowest index) up to best[index] that `fits()`."""
    for rung in range(best[index] + 1):
        picks[index] = rung
        if fits():
            return
    picks[index] = best[index]


def choose_codecs(cluster: Cluster, job: Job, assignment: np.ndarray, policy: CodecPolicy) -> CodecChoice:
    """The codec choice of the module docstring for `assignment[s][r]` (device indices) of `job`."""
    assignment = np.asarray(assignment, dtype=np.int64)
    stages, replicas = assignment.shape
    dp_names, pp_names = policy.dp_allowed, policy.pp_allowed
    def model(wire: WireBytes) -> YuanCostModel:
        return YuanCostModel(cluster, traffic_of_job(job, stages, replicas, wire))

    dp_table = np.stack([model(codec_link_bytes(name, job, "dp", replicas)).stage_dp_seconds(assignment)
                         for name in dp_names])
    pp_table = np.stack([model(codec_link_bytes(name, job, "pp")).cut_pp_seconds(assignment) for name in pp_names])
    dp_best = [int(np.argmin(dp_table[:, s])) for s in range(stages)]  # argmin: first (best quality) of ties
    pp_best = [int(np.argmin(pp_table[:, c, :].max(axis=1))) for c in range(stages - 1)]
    fastest = sum(_total(dp_table, pp_table, dp_best, pp_best))
    limit = fastest * (1.0 + policy.tolerance)
    dp_pick, pp_pick = list(dp_best), list(pp_best)

    def fits() -> bool:
        return sum(_total(dp_table, pp_table, dp_pick, pp_pick)) <= limit * (1 + 1e-12)

    for s in range(stages):
        _relax(dp_pick, dp_best, s, fits)
    for c in range(stages - 1):
        _relax(pp_pick, pp_best, c, fits)
    dp_s, pp_s = _total(dp_table, pp_table, dp_pick, pp_pick)
    base_dp, base_pp = _total(dp_table, pp_table, [0] * stages, [0] * (stages - 1))
    return CodecChoice(policy, tuple(dp_names[i] for i in dp_pick), tuple(pp_names[i] for i in pp_pick),
                       {"dp": dp_s, "pp": pp_s, "total": dp_s + pp_s},
                       {"dp": base_dp, "pp": base_pp, "total": base_dp + base_pp})
