"""Uneven layer split by device speed: the cost models' closed-form integer split agrees with the exact
DP (models.split.split_layers), reduces to today's numbers at equal shares, and lowers the predicted
iteration on a mixed-GPU cluster; the runtime's --split-by-speed and a plan's cut (plan --uneven-split)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from geotrain.cli.main import build_parser, main
from geotrain.cluster import load_cluster, make_network
from geotrain.cost import (CostModelError, LayerSplitError, ScheduleCostModel, StageShares, YuanComputeCostModel,
                           build_cost_model, counts_to_boundaries, device_peak_flops, speed_layer_counts, stage_speeds)
from geotrain.job import GPT_13B_SEED, load_job
from geotrain.models import even_boundaries, split_layers
from geotrain.models.split import stage_times
from geotrain.plan import Plan, PlanError
from geotrain.runtime import RuntimeConfig
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.stages import plan_cut, stage_boundaries, tiny_layer_model
from paths import ROOT

MIXED = ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml"   # A100 x2, V100 x2, T4 x2
TINY_JOB = ROOT / "examples" / "jobs" / "tiny-gpt.yaml"
PIPELINE_LOCAL = np.array([[0, 1], [2, 3], [4, 5]])                # stage 0 on the A100s, 1 V100s, 2 T4s


def test_speed_counts_reach_the_exact_dp_bottleneck_on_random_speeds():
    rng = np.random.default_rng(0)
    for case in range(400):
        stages = int(rng.integers(1, 6))
        layers = int(rng.integers(stages, 30))
        speeds = rng.choice([65.0, 125.0, 312.0, 989.0], size=stages) if case % 2 else rng.uniform(0.1, 10, size=stages)
        counts = speed_layer_counts(layers, speeds)
        assert counts.sum() == layers and counts.min() >= 1
        ones = np.ones(layers)
        exact = stage_times(ones, split_layers(ones, stages, speeds), speeds).max()
        assert stage_times(ones, counts_to_boundaries(counts), speeds).max() == pytest.approx(exact, rel=1e-12)


def test_speed_counts_are_vectorised_row_by_row_and_memoised_alike():
    rng = np.random.default_rng(1)
    speeds = rng.choice([65.0, 125.0, 312.0], size=(50, 4))
    batch = speed_layer_counts(24, speeds)
    assert all((batch[i] == speed_layer_counts(24, speeds[i])).all() for i in range(50))
    cluster = load_cluster(MIXED)
    shares = StageShares.build("speed", 3, 24, device_peak_flops(cluster))
    assignments = np.stack([rng.permutation(6).reshape(3, 2) for _ in range(40)])
    direct = speed_layer_counts(24, stage_speeds(assignments, device_peak_flops(cluster)))
    assert (shares.counts(assignments) == direct).all()
    assert (shares.counts(assignments) == direct).all()  # second call: from the memo


@pytest.mark.parametrize("layers, stages", [(24, 4), (27, 6), (6, 3), (5, 5), (7, 1)])
def test_equal_speeds_give_the_even_split(layers, stages):
    counts = speed_layer_counts(layers, np.full(stages, 125e12))
    assert counts_to_boundaries(counts) == even_boundaries(layers, stages)


def test_hand_checked_speed_split_of_24_layers_on_a100_v100_t4():
    # layers / TFLOP/s: 15/312 = 0.0481, 6/125 = 0.048, 3/65 = 0.0462; moving any layer raises the max
    # (16/312 = 0.0513, 7/125 = 0.056, 4/65 = 0.0615)
    assert speed_layer_counts(24, [312, 125, 65]).tolist() == [15, 6, 3]
    assert speed_layer_counts(24, [65, 125, 312]).tolist() == [3, 6, 15]


@pytest.mark.parametrize("factory", [YuanComputeCostModel, ScheduleCostModel])
def test_equal_shares_reproduce_todays_numbers(factory):
    cluster = load_cluster("seed-geo")  # all V100: the speed split is the equal split
    plain = factory.for_job(cluster, GPT_13B_SEED, 4, 8)
    rng = np.random.default_rng(2)
    batch = np.stack([rng.permutation(32).reshape(4, 8) for _ in range(5)])
    for spec in ("speed", [0.25] * 4):
        shared = factory.for_job(cluster, GPT_13B_SEED, 4, 8, layer_shares=spec)
        np.testing.assert_allclose(shared.evaluate_many(batch), plain.evaluate_many(batch), rtol=1e-12)
        a, b = shared.evaluate(batch[0]), plain.evaluate(batch[0])
        assert (a.dp, a.pp, a.total) == pytest.approx((b.dp, b.pp, b.total), rel=1e-12)
        np.testing.assert_allclose(a.dp_per_stage, b.dp_per_stage, rtol=1e-12)


@pytest.mark.parametrize("name", ["yuan+compute", "schedule"])
def test_speed_split_lowers_the_slowest_stage_and_the_iteration_on_a_mixed_cluster(name):
    cluster, job = load_cluster(MIXED), GPT_13B_SEED
    equal = build_cost_model(name, cluster, job, 3, 2)
    uneven = build_cost_model(name, cluster, job, 3, 2, layer_shares="speed")
    shares = uneven.shares.of(PIPELINE_LOCAL)
    assert shares.tolist() == [15 / 24, 6 / 24, 3 / 24]
    peak = device_peak_flops(cluster)[PIPELINE_LOCAL[:, 0]]
    stage_s = lambda share: 6 * job.params * job.seq_len * job.global_batch / 2 * share / (peak * 0.4)  # noqa: E731
    assert stage_s(shares).max() < 0.45 * stage_s(np.full(3, 1 / 3)).max()  # 15/312 vs 8/65 of the model
    assert uneven.evaluate(PIPELINE_LOCAL).total < 0.9 * equal.evaluate(PIPELINE_LOCAL).total
    if name == "yuan+compute":  # no overlap here: the compute term is the GPipe formula on the stage times
        m = equal.micro_batches
        expected = stage_s(shares).sum() / m + stage_s(shares).max() * (m - 1) / m
        assert uneven.evaluate(PIPELINE_LOCAL).extra["compute"] == pytest.approx(expected, rel=1e-12)
        # the A100 stage's gradient is 15/24 of the model: its all-reduce grows, the T4 stage's shrinks
        dp_equal, dp_uneven = equal.evaluate(PIPELINE_LOCAL).dp_per_stage, uneven.evaluate(PIPELINE_LOCAL).dp_per_stage
        assert dp_uneven[0] > dp_equal[0] and dp_uneven[2] < dp_equal[2]


def test_uneven_split_needs_a_compute_aware_model_and_valid_fractions():
    cluster = load_cluster(MIXED)
    with pytest.raises(CostModelError, match="needs one of yuan\\+compute, schedule"):
        build_cost_model("yuan", cluster, GPT_13B_SEED, 3, 2, layer_shares="speed")
    with pytest.raises(LayerSplitError, match="3 fractions > 0 summing to 1"):
        YuanComputeCostModel.for_job(cluster, GPT_13B_SEED, 3, 2, layer_shares=[0.5, 0.5, 0.5])
    with pytest.raises(LayerSplitError, match="cannot cut 2 layers into 3 stages"):
        speed_layer_counts(2, [1.0, 1.0, 1.0])


def test_runtime_speed_split_is_split_layers_on_the_stage_speeds_and_plain_when_alike():
    model = tiny_layer_model(RuntimeConfig.of(cluster=load_cluster(MIXED), assignment=[[0], [2], [4]]).model.gpt, 0)
    config = RuntimeConfig.of(cluster=load_cluster(MIXED), assignment=[[0], [2], [4]], split_by_speed=True)
    weights = config.split_weights()
    assert weights == pytest.approx((1.0, 125 / 312, 65 / 312))
    assert stage_boundaries(model, 3, "layers", 32, weights) == split_layers(np.ones(6), 3, weights) == (0, 4, 5, 6)
    params = model.layer_parameter_counts()
    assert stage_boundaries(model, 3, "params", 32, weights) == split_layers(params, 3, weights)
    uniform = RuntimeConfig.of(cluster=make_network([3], 10.0, (10.0, 10.0), (1.0, 1.0), seed=0),
                            assignment=[[0], [1], [2]], split_by_speed=True)
    assert uniform.split_weights() is None
    assert stage_boundaries(model, 3, "layers", 32, uniform.split_weights()) == even_boundaries(6, 3)
    assert stage_boundaries(model, 3, "params", 32, (2.0, 2.0, 2.0)) == stage_boundaries(model, 3, "params", 32)
    looped = RuntimeConfig.of(cluster=load_cluster(MIXED), assignment=[[0], [4]], split_by_speed=True,
                           schedule="interleaved-1f1b", microbatches=4)
    assert looped.split_weights() == pytest.approx((1.0, 65 / 312, 1.0, 65 / 312))  # virtual stage v on rank v % S


def test_plan_cut_maps_a_plan_of_the_blocks_onto_the_model_layers():
    assert plan_cut((0, 2, 3, 4), 6, 3) == (0, 3, 4, 6)     # 4 blocks: embedding joins stage 0, head the last
    assert plan_cut((0, 4, 5, 6), 6, 3) == (0, 4, 5, 6)     # the model's own layer count: as it is
    assert plan_cut((0, 15, 21, 24), 6, 3) is None          # another depth: cut by speed instead
    assert plan_cut((0, 2, 3, 4), 6, 6) is None             # virtual stages: another stage count
    assert plan_cut((), 6, 3) is None


def _train_args(*extra: str):
    return build_parser().parse_args(["train", "--cluster", str(MIXED), *extra])


def test_train_flag_and_plan_cut_reach_the_config_and_the_checkpoint_identity(tmp_path):
    from geotrain.cli.train_cmd import config_from_args

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"stages": 3, "replicas": 1, "assignment": [[0], [2], [4]]}))
    plain = config_from_args(_train_args("--plan", str(plan)))
    flagged = config_from_args(_train_args("--plan", str(plan), "--split-by-speed"))
    assert not plain.schedule.split_by_speed and plain.split_weights() is None and "split_by_speed" not in plain.identity()
    assert flagged.schedule.split_by_speed and flagged.identity()["split_by_speed"] is True
    planned = tmp_path / "uneven.json"
    planned.write_text(json.dumps({"stages": 3, "replicas": 1, "assignment": [[0], [2], [4]],
                                   "split": {"rule": "speed", "boundaries": [0, 2, 3, 4]}}))
    from_plan = config_from_args(_train_args("--plan", str(planned)))
    assert from_plan.schedule.split_by_speed and from_plan.schedule.split_boundaries == (0, 2, 3, 4)
    # resume refusal: a checkpoint cut by speed does not resume as a plain run, nor the reverse
    for saved, now in ((flagged, plain), (plain, flagged), (from_plan, flagged)):
        with pytest.raises(ckpt.CheckpointError, match="split"):
            ckpt.check_identity({"identity": saved.identity()}, now.identity(), "ckpt")
    ckpt.check_identity({"identity": flagged.identity()}, flagged.identity(), "ckpt")


def test_bad_plan_split_is_refused_naming_the_key():
    with pytest.raises(PlanError, match="split.boundaries must be 3 increasing integers from 0"):
        Plan.from_json({"stages": 2, "replicas": 1, "assignment": [[0], [1]], "split": {"boundaries": [0, 5, 5]}},
                       "p.json")


def test_plan_uneven_split_json_round_trips_into_train(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = main(["plan", "--cluster", str(MIXED), "--job", str(TINY_JOB), "--stages", "3", "--replicas", "2",
                 "--cost-model", "yuan+compute", "--uneven-split", "--method", "random", "-o", "samples=200",
                 "--out", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    split, assignment = doc["split"], np.array(doc["assignment"])
    job = load_job(str(TINY_JOB))
    speeds = stage_speeds(assignment, device_peak_flops(load_cluster(MIXED)))
    assert split["counts"] == speed_layer_counts(job.layers, speeds).tolist()
    assert split["boundaries"] == list(counts_to_boundaries(split["counts"]))
    assert split["cost_equal_split"]["total"] == pytest.approx(
        build_cost_model("yuan+compute", load_cluster(MIXED), job, 3, 2).evaluate(assignment).total, rel=1e-12)
    assert Plan.load(out).split.boundaries == tuple(split["boundaries"])
    from geotrain.cli.train_cmd import config_from_args

    assert config_from_args(_train_args("--plan", str(out))).schedule.split_boundaries == tuple(split["boundaries"])


def test_cost_scores_a_plan_with_its_recorded_split(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", str(MIXED), "--job", str(TINY_JOB), "--stages", "3", "--replicas", "2",
                 "--cost-model", "schedule", "--uneven-split", "--method", "random", "-o", "samples=50",
                 "--out", str(out), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main(["cost", "--cluster", str(MIXED), "--job", str(TINY_JOB), "--cost-model", "schedule",
                 "--plan", str(out), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    counts = planned["split"]["counts"]
    assert scored["layer_shares"] == pytest.approx([c / sum(counts) for c in counts])
    assert scored["cost"]["total"] == pytest.approx(planned["cost"]["total"], rel=1e-12)
    if counts != [counts[0]] * len(counts):
        assert scored["cost"]["total"] != pytest.approx(planned["split"]["cost_equal_split"]["total"], rel=1e-9)
    assert main(["cost", "--cluster", str(MIXED), "--job", str(TINY_JOB), "--plan", str(out)]) == 0
    assert "not seen by yuan" in capsys.readouterr().out


def test_plan_uneven_split_with_a_communication_only_model_exits_2(capsys):
    code = main(["plan", "--cluster", str(MIXED), "--stages", "3", "--replicas", "2", "--uneven-split",
                 "--cost-model", "yuan"])
    assert code == 2
    assert "needs one of yuan+compute, schedule" in capsys.readouterr().err
    # without --cost-model, GPUs of several types plan with "schedule", which splits the layers by speed
    assert main(["plan", "--cluster", str(MIXED), "--stages", "3", "--replicas", "2", "--uneven-split"]) == 0
    assert "schedule" in capsys.readouterr().out


def _tiny_run(cluster, **options):
    from geotrain.runtime import launch

    options = {"steps": 4, "batch_size": 4, "microbatches": 2, "time_scale": 0.0, "heartbeat_timeout_s": 20.0,
               **options}
    return launch(RuntimeConfig.of(cluster=cluster, assignment=[[0], [2], [4]], **options)).report


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_speed_split_trains_and_resumes_with_the_checkpoints_cut_on_other_gpus(tmp_path):
    mixed = load_cluster(MIXED)
    uninterrupted = _tiny_run(mixed, split_by_speed=True)
    assert uninterrupted.boundaries == (0, 4, 5, 6)  # A100 stage: embedding + 3 blocks; V100, T4: one layer each
    assert uninterrupted.losses[-1] < uninterrupted.losses[0]
    _tiny_run(mixed, split_by_speed=True, stop_after=2, checkpoint_dir=str(tmp_path))
    # same devices, all V100 now: the speed split alone would be the even one, the checkpoint's cut wins
    alike = make_network([2, 2, 2], 10.0, (1.0, 1.0), (35.0, 35.0), seed=0, name="all-v100")
    resumed = _tiny_run(alike, split_by_speed=True, resume=True, checkpoint_dir=str(tmp_path))
    assert resumed.boundaries == (0, 4, 5, 6)
    assert resumed.losses == uninterrupted.losses  # bit for bit
    planned = _tiny_run(mixed, steps=1, split_by_speed=True, split_boundaries=(0, 2, 3, 4))
    assert planned.boundaries == (0, 3, 4, 6)  # the plan's cut of the 4 blocks, embedding and head added


def test_an_unknown_gpu_exits_2_naming_it_when_the_cluster_file_loads(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: odd\nregions:\n  - {name: a, devices: 2, gpu: B200X}\ndefaults: {intra: {gbps: 10, ms: 0.1}}\n")
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"stages": 2, "replicas": 1, "assignment": [[0], [1]]}))
    assert main(["train", "--cluster", str(cluster), "--plan", str(plan), "--split-by-speed"]) == 2
    assert capsys.readouterr().err.startswith(f"geotrain: error: {cluster}: regions[0].gpu: unknown GPU type 'B200X' "
                                              f"(known: A10, A100, ")
