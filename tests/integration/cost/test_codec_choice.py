"""Codecs in the plan: bytes per value per link class in the cost model, the planner's codec choice,
the plan file's "codecs" object, and `geotrain train --plan` applying it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import region_cluster, seed_geo
from geotrain.cost import YuanCostModel, yuan_cost_reference
from geotrain.cost.codec_choice import (DP_LADDER, CodecPolicy, CodecPolicyError, choose_codecs, codec_link_bytes,
                                        parse_codec_policy)
from geotrain.cost.traffic import TrafficError, WireBytes, traffic_of_job
from geotrain.job import GPT_13B_SEED, Job
from geotrain.plan import Plan, PlanError
from geotrain.runtime import RuntimeConfig, RuntimeConfigError
from geotrain.cli.train_cmd import plan_settings
from geotrain.models import TINY_GPT
from geotrain.runtime.config import build_sections
from geotrain.runtime.config_file import merge_settings
from geotrain.runtime.stages import build_stage

GEOTRAIN = [sys.executable, "-m", "geotrain"]


def two_regions(inter_gbps: float = 0.1, inter_ms: float = 100.0, per_region: int = 2):
    return region_cluster("two", ["a", "b"], [per_region, per_region], np.array([[10.0, inter_gbps], [inter_gbps, 10.0]]),
                          np.array([[0.1, inter_ms], [inter_ms, 0.1]]))


@pytest.mark.parametrize("stages,replicas", [(4, 8), (2, 5), (1, 32), (8, 1)])
def test_unset_or_native_link_bytes_give_exactly_todays_numbers(stages, replicas):
    cluster = seed_geo()
    rng = np.random.default_rng(stages)
    assignment = rng.permutation(32)[: stages * replicas].reshape(stages, replicas)
    today = YuanCostModel.for_job(cluster, GPT_13B_SEED, stages, replicas).evaluate(assignment)
    native = GPT_13B_SEED.bytes_per_value
    for link_bytes in (WireBytes(), WireBytes.uniform(dp=native, pp=native)):
        cost = YuanCostModel(cluster, traffic_of_job(GPT_13B_SEED, stages, replicas, link_bytes)).evaluate(assignment)
        assert (cost.dp, cost.pp, cost.total) == (today.dp, today.pp, today.total)  # bit for bit


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([None, 0.125, 1.0, 2.0, 4.0]), min_size=4, max_size=4),
       st.sampled_from([1.0, 2.0]), st.integers(0, 1000))
def test_per_link_class_bytes_match_the_plain_loop_reference(values, latency_factor, seed):
    cluster = seed_geo()
    link_bytes = WireBytes(*values, dp_latency_rounds=latency_factor)
    assignment = np.random.default_rng(seed).permutation(32)[:16].reshape(4, 4)
    cost = YuanCostModel(cluster, traffic_of_job(GPT_13B_SEED, 4, 4, link_bytes)).evaluate(assignment)
    ref = yuan_cost_reference(cluster, traffic_of_job(GPT_13B_SEED, 4, 4, link_bytes), assignment.tolist())
    assert cost.dp == pytest.approx(ref["dp"], rel=1e-12)
    assert cost.pp == pytest.approx(ref["pp"], rel=1e-12)


def test_inter_region_bytes_only_scale_the_cross_region_pairs_by_hand():
    cluster = two_regions(inter_gbps=1.0, inter_ms=50.0)
    job = Job("t", params=2e9, seq_len=1000, hidden=1, global_batch=4, bytes_per_value=4)
    # stage 0 = {a0, b0} crosses regions; stage 1 = {a1, a2}... use [[0, 2], [1, 3]]: both DP groups cross.
    model = YuanCostModel(cluster, traffic_of_job(job, 2, 2, WireBytes(dp_intra=4, dp_inter=0.5, pp_intra=1, pp_inter=4)))
    cost = model.evaluate(np.array([[0, 2], [1, 3]]))
    c_dp = 2e9 * 4 / 2 * (0.5 / 4)
    assert cost.dp == pytest.approx(2 * (0.050 + 8 * c_dp / (2 * 1e9)))
    c_pp = 1000 * 1 * 4 * 2 * (1 / 4)  # pipelines stay inside a region: the intra bytes apply
    assert cost.pp == pytest.approx(2 * (0.0001 + 8 * c_pp / 10e9))


def test_link_bytes_refuse_non_positive_values():
    with pytest.raises(TrafficError, match="dp_inter must be a finite number > 0, got -1"):
        WireBytes(dp_inter=-1)


def test_policy_parsing_and_ladders():
    policy = parse_codec_policy("dp=powersgd,pp=fp16", tolerance=0.1)
    assert policy.dp_allowed == ("none", "fp16", "int8-block", "powersgd")
    assert policy.pp_allowed == ("none", "fp16")
    assert parse_codec_policy("pp=int4-block").pp_allowed == ("none", "fp16", "int8-block", "int4-block")
    assert parse_codec_policy("pp=none").dp == "int8-block"  # the default rung
    with pytest.raises(CodecPolicyError, match="--codec-policy dp: must be one of"):
        parse_codec_policy("dp=topk")
    with pytest.raises(CodecPolicyError, match="items must be dp=CODEC or pp=CODEC"):
        parse_codec_policy("sign")
    with pytest.raises(CodecPolicyError, match="dp given twice"):
        parse_codec_policy("dp=sign,dp=fp16")


def test_codec_bytes_follow_the_codecs_wire_sizes():
    job = Job("t", params=1e6, seq_len=8, hidden=128, global_batch=8, bytes_per_value=4)
    assert codec_link_bytes("none", job, "dp").dp_inter == 4
    assert codec_link_bytes("fp16", job, "dp").dp_inter == 2
    assert codec_link_bytes("sign", job, "dp", group_size=2).dp_inter == pytest.approx(1 / 8, rel=1e-4)
    gathered = codec_link_bytes("sign", job, "dp", group_size=8)
    assert gathered.dp_inter == pytest.approx(4 / 8, rel=1e-4) and gathered.dp_latency_rounds == 0.5  # all-gather
    assert codec_link_bytes("int8-block", job, "pp").pp_inter == pytest.approx(1 + 4 / 256)
    psgd = codec_link_bytes("powersgd", job, "dp")
    assert psgd.dp_inter == pytest.approx(4 * 4 * (128 + 512) / (128 * 512)) and psgd.dp_latency_rounds == 2


def test_choice_compresses_only_the_slow_links():
    # 2 regions x 4 devices, 2 stages x 4 replicas: stage 0 in region a (fast DP), stage 1 spread over both
    # regions (slow DP); the pipelines cross regions for replicas 2, 3.
    cluster = two_regions(inter_gbps=0.1, inter_ms=100.0, per_region=4)
    job = Job("t", params=1e6, seq_len=96, hidden=128, global_batch=32, bytes_per_value=4)  # ~ the tiny GPT
    assignment = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    assignment_mixed = np.array([[0, 1, 4, 5], [2, 3, 6, 7]])
    choice = choose_codecs(cluster, job, assignment, CodecPolicy())
    assert choice.dp == ("none", "none")  # both DP groups inside one region
    assert choice.pp == ("fp16",)  # every pipeline crosses
    assert choice.cost["total"] < choice.uncompressed["total"]
    mixed = choose_codecs(cluster, job, assignment_mixed, CodecPolicy())
    assert set(mixed.dp) <= set(DP_LADDER) and all(codec != "none" for codec in mixed.dp)  # both groups cross
    assert mixed.cost["dp"] < mixed.uncompressed["dp"] - 0.1  # saves most of the 0.16 s of transfer (0.4 s is latency)
    fp32_only = choose_codecs(cluster, job, assignment_mixed, CodecPolicy(dp="none", pp="none"))
    assert fp32_only.dp == ("none", "none") and fp32_only.cost == fp32_only.uncompressed


def test_packed_activation_codecs_are_priced_per_cut_and_chosen_on_the_slow_ones():
    # 3 stages x 2 replicas on two regions: cut 0 inside region a for both replicas, cut 1 across for both
    cluster = two_regions(inter_gbps=0.1, inter_ms=20.0, per_region=4)
    job = Job("t", params=1e6, seq_len=96, hidden=128, global_batch=32, bytes_per_value=4)
    assert codec_link_bytes("int4-block", job, "pp").pp_inter == pytest.approx(0.5 + 4 / 128)
    assert codec_link_bytes("sign-block", job, "pp").pp_inter == pytest.approx(1 / 8 + 4 / 128)
    assignment = np.array([[0, 1], [2, 3], [4, 5]])
    choice = choose_codecs(cluster, job, assignment, CodecPolicy(dp="none", pp="int4-block", tolerance=0.02))
    assert choice.pp == ("none", "int4-block")  # the fast cut keeps fp32, the slow one takes the fewest bytes
    fp16 = choose_codecs(cluster, job, assignment, CodecPolicy(dp="none", pp="fp16", tolerance=0.0))
    assert choice.cost["pp"] < fp16.cost["pp"] < fp16.uncompressed["pp"]


def test_choice_stays_within_the_tolerance_of_the_fastest_allowed_choice():
    cluster = seed_geo()
    assignment = np.random.default_rng(3).permutation(32).reshape(4, 8)
    fastest = choose_codecs(cluster, GPT_13B_SEED, assignment, CodecPolicy(tolerance=0.0))
    relaxed = choose_codecs(cluster, GPT_13B_SEED, assignment, CodecPolicy(tolerance=0.25))
    assert relaxed.cost["total"] <= 1.25 * fastest.cost["total"] * (1 + 1e-9)
    ladder = {name: i for i, name in enumerate(DP_LADDER)}
    assert all(ladder[a] <= ladder[b] for a, b in zip(relaxed.dp, fastest.dp))  # never worse quality


def test_plan_codecs_round_trip_and_old_plans_have_none():
    doc = {"stages": 2, "replicas": 2, "assignment": [[0, 2], [1, 3]]}
    assert Plan.from_json(doc).codecs is None
    plan = Plan.from_json({**doc, "codecs": {"version": 1, "dp": ["none", "sign"], "pp": ["fp16"]}})
    assert plan.codecs.dp == ("none", "sign") and plan.codecs.pp == ("fp16",)
    assert Plan.from_json(plan.to_json()).codecs == plan.codecs
    with pytest.raises(PlanError, match=r"codecs.pp must be a list of 1 codec specs \(one per stage cut\)"):
        Plan.from_json({**doc, "codecs": {"dp": ["none", "none"], "pp": []}})
    with pytest.raises(PlanError, match="codecs.version must be an integer in 1..1"):
        Plan.from_json({**doc, "codecs": {"version": 2, "dp": ["none", "none"], "pp": ["none"]}})


def test_runtime_config_takes_the_plans_codecs_and_flags_override():
    cluster = two_regions()
    plan = Plan.from_json({"stages": 2, "replicas": 2, "assignment": [[0, 2], [1, 3]],
                           "codecs": {"dp": ["none", "sign"], "pp": ["fp16"]}})
    config = RuntimeConfig(cluster, plan.assignment, **build_sections(plan_settings(plan)))
    assert [str(config.comm.stage_dp_codec(s)) for s in (0, 1)] == ["none", "sign"]
    assert str(config.comm.cut_pp_codec(0)) == "fp16"
    assert str(config.for_stage(1).comm.dp_codec) == "sign" and config.identity()["dp_codecs"] == ["none", "sign"]
    flags = {"comm": {"dp_codec": "fp16"}}
    flagged = RuntimeConfig(cluster, plan.assignment, **build_sections(merge_settings(plan_settings(plan), flags)))
    assert [str(flagged.comm.stage_dp_codec(s)) for s in (0, 1)] == ["fp16", "fp16"]
    assert str(flagged.comm.cut_pp_codec(0)) == "fp16"
    with pytest.raises(RuntimeConfigError, match="pipeline codec must be one of"):
        RuntimeConfig.of(cluster=cluster, assignment=plan.assignment, pp_codecs=("topk",))
    with pytest.raises(RuntimeConfigError, match="gradient codec 'nope'"):
        RuntimeConfig.of(cluster=cluster, assignment=plan.assignment, dp_codecs=("none", "nope"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_plan_with_codecs_auto_is_applied_by_train(tmp_path: Path):
    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text("name: c2\nregions:\n  - {name: a, devices: 2}\n  - {name: b, devices: 2}\n"
                            "links:\n  - {between: [a, b], gbps: 0.01, ms: 20}\ndefaults: {intra: {gbps: 10, ms: 0.1}}\n")
    plan_file = tmp_path / "plan.json"
    plan = {"method": "manual", "stages": 2, "replicas": 2, "assignment": [[0, 2], [1, 3]],
            "codecs": {"version": 1, "dp": ["none", "sign"], "pp": ["fp16"]}}
    plan_file.write_text(json.dumps(plan))
    done = subprocess.run([*GEOTRAIN, "train", "--run-dir", "none", "--cluster", str(cluster_file), "--plan", str(plan_file), "--steps", "2",
                           "--time-scale", "0.01", "--json"], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    n0, n1 = (sum(p.numel() for p in build_stage(TINY_GPT, 0, s, 2).parameters()) for s in (0, 1))
    assert result["bytes"]["dp_per_stage"] == [4 * n0, -(-n1 // 8) + 4]  # fp32; sign: 1 bit + a scale
    activations = 8 * 96 * 128  # batch x context x d_model values per replica per iteration
    assert result["bytes"]["pp_per_cut"] == 2 * activations  # fp16 on the wire
    assert result["summary"]["replicas_in_sync"] is True
    assert result["config"]["dp_codecs"] == ["none", "sign"]


def test_plan_cli_records_the_choice_and_train_reads_it(tmp_path: Path):
    out = tmp_path / "plan.json"
    done = subprocess.run([*GEOTRAIN, "plan", "--cluster", "seed-geo", "--stages", "4", "--replicas", "8",
                           "--method", "random", "--codecs", "auto", "--codec-policy", "dp=powersgd,pp=fp16",
                           "--json", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    codecs = doc["codecs"]
    assert codecs["policy"] == "dp=powersgd,pp=fp16" and len(codecs["dp"]) == 4 and len(codecs["pp"]) == 3
    assert set(codecs["dp"]) <= {"none", "fp16", "int8-block", "powersgd"} and set(codecs["pp"]) <= {"none", "fp16"}
    assert codecs["uncompressed"]["total"] == pytest.approx(doc["cost"]["total"])
    assert codecs["cost"]["total"] < codecs["uncompressed"]["total"]
    plan = Plan.from_json(json.loads(out.read_text()))
    assert plan.codecs.dp == tuple(codecs["dp"]) and plan.codecs.pp == tuple(codecs["pp"])
    refused = subprocess.run([*GEOTRAIN, "plan", "--cluster", "seed-geo", "--codecs", "auto"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--codecs auto applies to a fixed layout" in refused.stderr
    bad = subprocess.run([*GEOTRAIN, "plan", "--cluster", "seed-geo", "--stages", "2", "--replicas", "2",
                          "--codecs", "auto", "--codec-policy", "dp=topk"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--codec-policy dp: must be one of" in bad.stderr
