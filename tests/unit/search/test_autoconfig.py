"""Auto-configuration: memory model by hand, model shapes, the search's choices and its CLI contract."""

import json

import numpy as np
import pytest

from geotrain.cli.main import main
from geotrain.cluster import region_cluster
from geotrain.cost.compute import YuanComputeCostModel
from geotrain.cost.schedule import ScheduleCostModel
from geotrain.cost.gpus import gpu_memory_bytes
from geotrain.cost.memory import MemoryConfig, MemoryConfigError, stage_memory_bytes, state_bytes_per_param
from geotrain.job import Job, JobError, load_job
from geotrain.model_shapes import MODEL_SHAPES
from geotrain.search import PlacementProblem, pipeline_local
from geotrain.search.autoconfig import AutoConfigOptions, NoFeasibleConfigError, auto_configure
from geotrain.search.region_heuristics import RegionHeuristicConfig

SMALL = Job(name="small", params=1e9, seq_len=10, hidden=1000, global_batch=8, layers=4, vocab=1000)


def test_stage_memory_matches_hand_computation():
    per_layer = (1e9 - 1e6) / 4
    layer_acts = 34 * 10 * 2 * 1000  # seq x (8 / (R 2 x M 2) = 2 sequences) x hidden x 34 bytes
    expected = np.array([
        16 * (2 * per_layer + 1e6) + 2 * 2 * layer_acts,                     # 1F1B: stage 0 holds min(M, S) = 2
        16 * (2 * per_layer + 1e6) + 1 * 2 * layer_acts + 4 * 10 * 2 * 1000,  # stage 1 holds 1, plus fp32 logits
    ])
    got = stage_memory_bytes(SMALL, 2, 2, 2, MemoryConfig())
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    gpipe = stage_memory_bytes(SMALL, 2, 2, 2, MemoryConfig(schedule="gpipe"))
    assert gpipe[1] - got[1] == pytest.approx(2 * layer_acts)


def test_zero_sharding_and_recompute_reduce_memory():
    assert state_bytes_per_param(MemoryConfig(), 4) == 16
    assert state_bytes_per_param(MemoryConfig(zero=1), 4) == 4 + 12 / 4
    assert state_bytes_per_param(MemoryConfig(zero=2), 4) == 2 + 14 / 4
    assert state_bytes_per_param(MemoryConfig(zero=3), 4) == 4
    plain = stage_memory_bytes(SMALL, 2, 2, 2, MemoryConfig())
    assert np.all(stage_memory_bytes(SMALL, 2, 2, 2, MemoryConfig(recompute=True)) < plain)
    with pytest.raises(MemoryConfigError, match="--zero"):
        MemoryConfig(zero=4)


def test_gpu_memory_table_uses_binary_gigabytes():
    assert gpu_memory_bytes("V100") == 16 * 2**30
    assert gpu_memory_bytes("a100-80gb") == 80 * 2**30


def test_job_model_shortcut_takes_published_shape_and_keys_override(tmp_path):
    path = tmp_path / "j.yaml"
    path.write_text("model: llama-7b\nglobal_batch: 256\n")
    job = load_job(path)
    shape = MODEL_SHAPES["llama-7b"]
    assert (job.params, job.layers, job.hidden, job.vocab, job.seq_len) == (6.7e9, 32, 4096, 32000, 2048)
    assert job.global_batch == 256 and shape.global_batch == 2048
    assert load_job("gpt3-xl").layers == 24 and load_job("llama-13b").hidden == 5120
    path.write_text("model: llama-70x\n")
    with pytest.raises(JobError, match="model: unknown model shape 'llama-70x'"):
        load_job(path)


def mixed_cluster():
    """4 fast 80 GB GPUs in one region, 4 T4 (16 GiB, 65 TFLOP/s) in another, 1 Gbit/s 50 ms between."""
    bw = np.array([[100.0, 1.0], [1.0, 10.0]])
    ms = np.array([[0.01, 50.0], [50.0, 0.1]])
    return region_cluster("mixed", ["fast", "slow"], [4, 4], bw, ms, ["A100-80GB", "T4"])


JOB = Job(name="mid", params=2e9, seq_len=1024, hidden=2048, global_batch=16, layers=8, vocab=32000)


def test_auto_config_leaves_small_slow_devices_idle_and_respects_memory():
    cluster = mixed_cluster()
    result = auto_configure(cluster, JOB, AutoConfigOptions(top=4))
    chosen = result.candidates[0]
    assert chosen.devices_used < cluster.n_devices
    assert all(cluster.gpus[d] == "A100-80GB" for d in chosen.assignment.ravel())
    totals = [c.iteration_s for c in result.candidates]
    assert totals == sorted(totals)
    for c in result.candidates:
        need = stage_memory_bytes(JOB, c.stages, c.replicas, c.microbatches, MemoryConfig()).max()
        assert c.memory_per_device_bytes == pytest.approx(need)
        assert all(gpu_memory_bytes(cluster.gpus[d]) >= need for d in c.assignment.ravel())
        assert len(set(c.assignment.ravel().tolist())) == c.devices_used
        assert c.bound_s <= c.iteration_s * (1 + 1e-9)
        schedule = ScheduleCostModel.for_job(cluster, JOB, c.stages, c.replicas, micro_batches=c.microbatches)
        assert schedule.evaluate(c.assignment).total == pytest.approx(c.iteration_s)
        screen = YuanComputeCostModel.for_job(cluster, JOB, c.stages, c.replicas, micro_batches=c.microbatches)
        assert screen.evaluate(c.assignment).total == pytest.approx(c.screen_s)


def test_yuan_compute_ranking_scores_and_bounds_with_that_model():
    cluster = mixed_cluster()
    for c in auto_configure(cluster, JOB, AutoConfigOptions(rank_model="yuan+compute")).candidates:
        model = YuanComputeCostModel.for_job(cluster, JOB, c.stages, c.replicas, micro_batches=c.microbatches)
        assert model.evaluate(c.assignment).total == pytest.approx(c.iteration_s)
        assert c.bound_s <= c.iteration_s * (1 + 1e-9)


def test_auto_config_beats_the_fixed_full_layout():
    cluster = mixed_cluster()
    chosen = auto_configure(cluster, JOB).candidates[0]
    model = YuanComputeCostModel.for_job(cluster, JOB, 2, 4, micro_batches=4)
    fixed = pipeline_local(PlacementProblem(cluster, model), RegionHeuristicConfig()).assignment
    assert chosen.iteration_s < ScheduleCostModel.for_job(cluster, JOB, 2, 4, micro_batches=4).evaluate(fixed).total


def test_nothing_fits_names_the_binding_constraint():
    cluster = mixed_cluster()
    huge = Job(name="huge", params=2e11, seq_len=1024, hidden=8192, global_batch=8, layers=4, vocab=32000)
    with pytest.raises(NoFeasibleConfigError, match=r"stage \d needs [\d.]+ GB .* largest GPU has 85.9 GB \(A100-80GB\)"):
        auto_configure(cluster, huge)


def test_plan_cli_auto_config_json_contract(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: two\nregions:\n  - {name: a, devices: 4, gpu: A100}\n  - {name: b, devices: 4, gpu: V100}\n"
                       "links:\n  - {between: [a, b], gbps: 1, ms: 50}\ndefaults: {intra: {gbps: 10, ms: 0.1}}\n")
    plan = tmp_path / "p.json"
    assert main(["plan", "--cluster", str(cluster), "--job", "gpt3-xl", "--top", "3", "--json", "--out", str(plan)]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("stages", "replicas", "assignment", "cost", "microbatches", "devices_used",
                "memory_per_device_bytes", "candidates"):
        assert key in doc
    assert len(doc["candidates"]) <= 3 and doc["candidates"][0]["stages"] == doc["stages"]
    assert doc["devices_used"] == doc["stages"] * doc["replicas"]
    assert main(["cost", "--cluster", str(cluster), "--plan", str(plan), "--job", "gpt3-xl", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cost"]["dp"] == pytest.approx(doc["cost"]["dp"])
    assert main(["plan", "--cluster", str(cluster), "--job", "gpt3-xl"]) == 0
    assert "chosen:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [(["--stages", "4"], "give both --stages and --replicas, or neither"),
                                           (["--lower-bound"], "--method and --lower-bound apply to a fixed layout"),
                                           (["--method", "genetic"], "--method and --lower-bound apply to a fixed layout")])
def test_plan_cli_refuses_half_layouts_and_fixed_layout_options(capsys, argv, message):
    assert main(["plan", "--cluster", "seed-geo", *argv]) == 2
    assert message in capsys.readouterr().err


def test_stage_memory_follows_an_uneven_layer_split():
    from geotrain.cost.memory import stage_layers

    equal = stage_memory_bytes(JOB, 2, 2, 2, MemoryConfig())
    assert np.allclose(stage_memory_bytes(JOB, 2, 2, 2, MemoryConfig(), np.array([0.5, 0.5])), equal)
    uneven = stage_memory_bytes(JOB, 2, 2, 2, MemoryConfig(), np.array([0.75, 0.25]))
    assert stage_layers(JOB, 2, np.array([0.75, 0.25])).tolist() == [6.0, 2.0]
    assert uneven[0] > equal[0] and uneven[1] < equal[1]
    # the difference is exactly 2 layers' states and in-flight activations per stage
    per_layer_params = (JOB.params - JOB.vocab * JOB.hidden) / JOB.layers
    acts = 34.0 * JOB.seq_len * (JOB.global_batch / 4) * JOB.hidden
    assert uneven[0] - equal[0] == pytest.approx(2 * (per_layer_params * 16.0 + 2 * acts))
    with pytest.raises(MemoryConfigError, match="summing to 1"):
        stage_memory_bytes(JOB, 2, 2, 2, MemoryConfig(), np.array([0.7, 0.7]))


def test_auto_config_takes_the_speed_split_where_it_is_faster_and_fits():
    from geotrain.search.autoconfig import better_split

    bw = np.array([[25.0, 5.0], [5.0, 25.0]])
    ms = np.array([[0.1, 2.0], [2.0, 0.1]])
    cluster = region_cluster("two-gens", ["new", "old"], [2, 2], bw, ms, ["A100-80GB", "V100"])
    result = auto_configure(cluster, JOB, AutoConfigOptions(top=3, rank_model="yuan+compute"))
    pipelined = [c for c in result.candidates if c.stages == 2 and len({cluster.gpus[d] for d in c.assignment.ravel()}) == 2]
    for c in result.candidates:
        again = better_split(cluster, JOB, c, AutoConfigOptions(rank_model="yuan+compute"))
        assert again.iteration_s == pytest.approx(c.iteration_s, rel=1e-12)
        if c.split is not None:
            assert c.split["rule"] == "speed" and sum(c.split["counts"]) == JOB.layers
    if pipelined:  # a stage on A100s next to one on V100s: the A100 stage takes more layers
        c = pipelined[0]
        assert c.split is not None and max(c.split["counts"]) > JOB.layers // 2
