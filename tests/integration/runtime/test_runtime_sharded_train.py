"""`geotrain train --plan` with sharded replicas (plan --shards 2): 2 sites x 2 shards, each site's slot two
processes holding FSDP2 shards of the tiny model, DiLoCo per shard across the sites, on emulated links.

Runs (module fixture, 8 steps each): the sharded plan and the unsharded one (one process per site, the same
replicas) with --sync-every 4 --fragments 2 --sync-delay 1, no codec and a validation every 4 steps; the same pair
with --sync-moments (the inner AdamW's moments averaged per shard); the sharded plan with int8-block (and the outer
state in host memory, --outer-state host), and with
adaptive local steps; and a pair with --dp-hierarchical on examples/clusters/lab-2x4.yaml: 4 sites of 2 devices,
two in region east and two in west (8 ranks sharded, 4 unsharded), each region's same-shard ranks averaging their
gradients every step and the outer sync hierarchical per shard; and a pair of 2 pipeline stages x 2 sites x 2 shards
(8 ranks; unsharded 4) on the same cluster with --schedule 1f1b, of tests/user_models.py's model (its embedding
tied to its output layer across the cut). Five runs after one another in each of two
processes side by side (tests/one_interpreter.py: a process's later launches skip their seconds of imports).
Tolerance of the float check: both runs compute in float32 and differ only in how a step's gradient is summed
(FSDP reduce-scatters the mean of the two shards' gradients of 4 sequences each; the unsharded rank sums the 8 at
once), so their losses first differ in the last bits (2.4e-7 = 1 ulp of a loss near 3.8) and AdamW's normalised
steps carry that through 8 steps without growth: measured at most 9.2e-6 (the last step, after two outer syncs);
the bound 1e-4 is 10x that and 2000x below the loss's fall over the run, so a run that did not equal the unsharded
one (a shard on the wrong rows, a gradient not averaged over the slot) fails it. The same argument holds with the
moments (both runs send them in fp32 and average them alike; measured 3.0e-7), with regions (the region's mean and
the hierarchy's sums run in the same order on a shard as on the whole tensor; measured 1.2e-7) and with pipeline stages
(each shard's micro-batches cross the cut to the same shard of the next stage, and the tied weight's shards are summed
with the same shard's on the other stage; measured 4.8e-7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from one_interpreter import OneInterpreter, results_of
from runtime_2x2 import CLUSTER_YAML
from user_models import USER_GPT

SHARDED = {"method": "manual", "stages": 1, "replicas": 2, "assignment": [[0, 2]],
           "shards": {"k": 2, "devices": [[[0, 1], [2, 3]]]}}
UNSHARDED = {"method": "manual", "stages": 1, "replicas": 2, "assignment": [[0, 2]]}
STREAMING = ("--sync-every", "4", "--fragments", "2", "--sync-delay", "1", "--outer-lr", "1", "--outer-momentum", "0")
REGIONS_CLUSTER = Path(__file__).parents[3] / "examples" / "clusters" / "lab-2x4.yaml"
"""Devices 0-3 are region east, 4-7 west: the plans below put two sites (slots) in each."""
SHARDED_REGIONS = {"method": "manual", "stages": 1, "replicas": 4, "assignment": [[0, 2, 4, 6]],
                   "shards": {"k": 2, "devices": [[[0, 1], [2, 3], [4, 5], [6, 7]]]}}
UNSHARDED_REGIONS = {"method": "manual", "stages": 1, "replicas": 4, "assignment": [[0, 2, 4, 6]]}
HIERARCHICAL = ("--sync-every", "4", "--fragments", "2", "--outer-lr", "1", "--outer-momentum", "0",
                "--dp-hierarchical", "--time-scale", "0")
SHARDED_PIPELINE = {"method": "manual", "stages": 2, "replicas": 2, "assignment": [[0, 4], [2, 6]],
                    "shards": {"k": 2, "devices": [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]}}
UNSHARDED_PIPELINE = {"method": "manual", "stages": 2, "replicas": 2, "assignment": [[0, 4], [2, 6]]}
PIPELINE = ("--sync-every", "4", "--fragments", "2", "--outer-lr", "1", "--outer-momentum", "0", "--schedule", "1f1b",
            "--time-scale", "0")
TOLERANCE = 1e-4
"""How far a sharded run's loss may be from the unsharded run's (module doc)."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _train(root: Path, name: str, plan: dict, *flags: str, cluster: Path | None = None) -> list[str]:
    """The words of `geotrain train` for `plan` (written into `root` as NAME.json) and `flags` on `cluster`
    (None: root's cluster.yaml)."""
    (root / f"{name}.json").write_text(json.dumps(plan))
    cluster = root / "cluster.yaml" if cluster is None else cluster
    return ["train", "--run-dir", "none", "--cluster", str(cluster), "--plan", str(root / f"{name}.json"),
            "--steps", "8", "--json", *flags]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("sharded-train")
    (root / "cluster.yaml").write_text(CLUSTER_YAML)
    (root / "my_model.py").write_text(USER_GPT)
    tied = ("--model", f"{root / 'my_model.py'}:build")
    emulated = ("--time-scale", "1e-3", "--eval-every", "4")
    commands = {"sharded": _train(root, "sharded", SHARDED, *STREAMING, *emulated),
                "unsharded": _train(root, "unsharded", UNSHARDED, *STREAMING, *emulated),
                "int8": _train(root, "int8", SHARDED, *STREAMING, "--dp-codec", "int8-block", "--outer-state", "host",
                               "--time-scale", "0"),
                "adaptive": _train(root, "adaptive", SHARDED, "--sync-every", "4", "--local-steps", "adaptive",
                                   "--outer-lr", "1", "--outer-momentum", "0", "--time-scale", "0"),
                "moments": _train(root, "moments", SHARDED, *STREAMING, "--sync-moments", "--time-scale", "0"),
                "moments-unsharded": _train(root, "moments-unsharded", UNSHARDED, *STREAMING, "--sync-moments",
                                            "--time-scale", "0"),
                "regions": _train(root, "regions", SHARDED_REGIONS, *HIERARCHICAL, cluster=REGIONS_CLUSTER),
                "regions-unsharded": _train(root, "regions-unsharded", UNSHARDED_REGIONS, *HIERARCHICAL,
                                            cluster=REGIONS_CLUSTER),
                "pipeline": _train(root, "pipeline", SHARDED_PIPELINE, *PIPELINE, *tied, cluster=REGIONS_CLUSTER),
                "pipeline-unsharded": _train(root, "pipeline-unsharded", UNSHARDED_PIPELINE, *PIPELINE, *tied,
                                             cluster=REGIONS_CLUSTER),
                "async": _train(root, "async", SHARDED, "--sync-every", "2", "--outer-sync", "async", "--outer-lr", "1",
                                "--outer-momentum", "0", "--eval-every", "8", "--time-scale", "1e-3", "--sync-moments")}
    parts = [("sharded", "adaptive", "moments-unsharded", "regions", "pipeline-unsharded"),
             ("unsharded", "int8", "moments", "regions-unsharded", "pipeline", "async")]
    processes = [OneInterpreter([commands[name] for name in names], root, f"part{i}") for i, names in enumerate(parts)]
    reports = {}
    for names, results in zip(parts, results_of(processes)):
        for name, done in zip(names, results):
            assert done.returncode == 0, (name, done.stderr)
            reports[name] = json.loads(done.stdout)
    return reports


def test_a_sharded_run_equals_the_unsharded_run_of_the_same_sites(runs):
    sharded, unsharded = runs["sharded"]["losses"], runs["unsharded"]["losses"]
    assert len(sharded) == len(unsharded) == 8
    worst = max(abs(a - b) for a, b in zip(sharded, unsharded, strict=True))
    assert worst <= TOLERANCE, (sharded, unsharded)
    assert sharded[0] - min(sharded) > 2000 * TOLERANCE  # the check can fail: the loss moved far beyond it
    # validation: every shard of a slot scores the replica's windows through FSDP2's forward
    validation = [(v["step"], v["loss"]) for v in runs["sharded"]["validation"]]
    expected = [(v["step"], v["loss"]) for v in runs["unsharded"]["validation"]]
    assert [step for step, _ in validation] == [step for step, _ in expected] == [4, 8]
    assert max(abs(a[1] - b[1]) for a, b in zip(validation, expected)) <= TOLERANCE, (validation, expected)


def test_with_moment_sync_a_sharded_run_equals_the_unsharded_run(runs):
    """Each shard's AdamW moments (DTensors) average with its peer's local shard, as the whole moments do unsharded:
    the losses agree within the tolerance, and the moments moved them more than 100 x that (the pair without
    moments, the same flags otherwise); each sync carries the outer gradient and both moments (fp32: 3 x)."""
    sharded, unsharded = runs["moments"]["losses"], runs["moments-unsharded"]["losses"]
    assert len(sharded) == len(unsharded) == 8 and runs["moments"]["summary"]["replicas_in_sync"]
    assert max(abs(a - b) for a, b in zip(sharded, unsharded, strict=True)) <= TOLERANCE, (sharded, unsharded)
    assert max(abs(a - b) for a, b in zip(sharded, runs["sharded"]["losses"], strict=True)) > 100 * TOLERANCE
    with_moments = [row["dp_bytes"] for row in runs["moments"]["iterations"]]
    without = [row["dp_bytes"] for row in runs["sharded"]["iterations"]]
    assert with_moments == [3 * b for b in without], (with_moments, without)


def test_with_regions_a_sharded_run_equals_the_unsharded_run(runs):
    """--dp-hierarchical on 2 regions of 2 sites: a shard averages with its region's same-shard ranks every step
    and hierarchically with the other region's at each outer sync; the losses agree with the unsharded run's, and
    every step each shard sends half of what the unsharded rank does (the region mean every step, the outer syncs
    on top)."""
    sharded, unsharded = runs["regions"]["losses"], runs["regions-unsharded"]["losses"]
    assert len(sharded) == len(unsharded) == 8 and runs["regions"]["summary"]["replicas_in_sync"]
    assert max(abs(a - b) for a, b in zip(sharded, unsharded, strict=True)) <= TOLERANCE, (sharded, unsharded)
    assert sharded[0] - min(sharded) > 2000 * TOLERANCE
    halves = [row["dp_bytes"] for row in runs["regions"]["iterations"]]
    wholes = [row["dp_bytes"] for row in runs["regions-unsharded"]["iterations"]]
    assert all(b > 0 for b in halves) and halves[1] > halves[0]  # step 2: an outer sync on top of the region mean
    for half, whole in zip(halves, wholes, strict=True):
        assert half == pytest.approx(whole / 2, rel=0.01)


def test_every_shard_ends_equal_to_its_peer_and_the_loss_falls(runs):
    for name in ("sharded", "int8"):
        report = runs[name]
        # replicas_in_sync: at every step each shard's float64 weight sum equals its peer's at the other site
        assert report["summary"]["replicas_in_sync"], name
        losses = report["losses"]
        assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.1, (name, losses)


def test_adaptive_local_steps_keep_each_shard_with_its_peer_between_syncs(runs):
    """--local-steps adaptive: a site's two shards agree on their step time (the slower's), so they take the same
    steps and meet their peers at each sync: the report compares each shard's anchor between the same landed
    syncs (a shard that stepped alone would hang FSDP2's collectives or leave its peer's anchor)."""
    report = runs["adaptive"]
    assert report["rows_by"] == "progress" and report["summary"]["replicas_in_sync"]
    assert all(loss == loss for loss in report["losses"]) and report["losses"][-1] < report["losses"][0] - 0.3


def test_each_shard_sends_its_half_of_the_outer_sync_between_the_sites(runs):
    """Per outer sync the two shards' exchanges carry what the unsharded replica's carries (fp32, no codec)."""
    sharded = [row["dp_bytes"] for row in runs["sharded"]["iterations"]]
    unsharded = [row["dp_bytes"] for row in runs["unsharded"]["iterations"]]
    assert [b > 0 for b in sharded] == [b > 0 for b in unsharded] == [False, False, True, False, True, False, True,
                                                                       True]
    for one_shard, whole in zip(sharded, unsharded, strict=True):  # rows cut in half: FSDP2's dim-0 chunks
        assert one_shard == pytest.approx(whole / 2, rel=0.01)


def test_each_rank_holds_the_planners_state_per_device_half_the_unsharded_ranks(runs):
    """summary.memory (runtime/memory_use.py): the tensors a rank holds at the end, counted from their storages,
    against cost.memory's state per device (16 bytes per parameter for weights, gradients and AdamW's moments, 4 for
    DiLoCo's anchor (no outer momentum at --outer-momentum 0), 4 for int8-block's residual, none for no codec; over
    K). They differ by AdamW's step counters (one 4-byte scalar per parameter tensor) and the outer sync's gradient
    carriers (sync/base.grad_carrier: one 4-byte element per tensor, their gradients freed once an exchange landed);
    a shard holding the whole model, a carrier holding values or gradients kept between syncs, or a residual counted
    or kept where it should not be, would be off by a megabyte. With --outer-state host (the int8 run) everything
    the sync holds is in host memory and the device holds weights, gradients and AdamW only; otherwise (a CPU run,
    the outer state on the emulated device) nothing is in host memory."""
    shard_weights = {}
    for name, k, residual in (("sharded", 2, 0), ("unsharded", 1, 0), ("int8", 2, 4)):
        memory = runs[name]["summary"]["memory"]
        ranks = memory["per_rank"]
        assert len(ranks) == 2 * k
        for rank in ranks:
            assert rank["predicted_state"] == memory["predicted_state_per_stage"][0]
            assert rank["weights"] == rank["gradients"] and rank["optimizer"] >= 2 * rank["weights"]
            counters = rank["optimizer"] - 2 * rank["weights"]  # AdamW's step counters: 4 bytes per tensor
            assert 0 < counters <= 4 * 64, (name, rank)  # the tiny model: fewer than 64 tensors
            assert rank["state"] - rank["predicted_state"] == 2 * counters, (name, rank)
            # the anchor (and residual), and one 4-byte gradient carrier per tensor
            assert rank["sync"] == (4 + residual) * rank["weights"] / 4 + counters, (name, rank)
            assert rank["peak_rss"] > rank["state"]
            host = rank["sync"] if name == "int8" else 0
            assert (rank["host"], rank["device"]) == (host, rank["state"] - host), (name, rank)
        shard_weights[name] = ranks[0]["weights"]
    assert shard_weights["sharded"] * 2 == shard_weights["unsharded"]  # each shard: half the model (the tiny one splits evenly)


def test_the_shards_of_a_slot_send_what_the_unsharded_replica_sends(runs):
    """Per outer sync each shard sends its 1/K of the stage to its peer: together the slot's K shards put on the WAN
    the bytes the unsharded rank puts there (fp32, no codec: exactly; a block codec differs by the blocks a shard's cut
    opens: measured +8 bytes in 1,659,320 with int8-block, docs/guide/slow-links.md)."""
    sharded, unsharded = runs["sharded"]["bytes"]["dp_per_stage"][0], runs["unsharded"]["bytes"]["dp_per_stage"][0]
    assert sharded > 0 and 2 * sharded == unsharded


def test_asynchronous_updates_run_a_global_models_server_per_shard(runs):
    """--outer-sync async on the sharded plan, on emulated links: a server per shard position (on site 0's rank of that
    shard; shard 1's serving in shard 0's order, sync/async_timing.py), each rank its client: a push carries the rank's shard (half the model; fp32 and a 40-byte header; the final step's
    record also holds the final request's header), every rank scores one final model, and the loss falls. Without
    the per-shard server the run is refused (geotrain.sync.sharded); a push of the whole model is 2 x 1.6 MB. With
    --sync-moments each shard's push also carries its shard's AdamW second moments (sync/async_moments.py): 2 x."""
    report = runs["async"]
    shard = report["summary"]["memory"]["per_rank"][0]["weights"]
    assert 2 * shard == runs["unsharded"]["summary"]["memory"]["per_rank"][0]["weights"]
    pushes = {row["dp_bytes"] for row in report["iterations"]} - {0}  # a row of the run's progress: 1 or more pushes
    push = 40 + 2 * shard  # [shard | exp_avg_sq], fp32
    assert any(b - push in (0, 40) for b in pushes) and all(b % push in (0, 40) for b in pushes), (pushes, shard)
    validation = {entry["loss"] for entry in report["validation"]}
    assert len(validation) == 1 and validation.pop() < report["losses"][0] - 0.3, report["validation"]


def test_with_pipeline_stages_a_sharded_run_equals_the_unsharded_run(runs):
    """2 stages x 2 sites x 2 shards, 1F1B: each stage's slot holds FSDP2 shards, a shard's activations go to the
    same shard of the next stage, the tied embedding's gradient shards are summed with the output layer's, and the
    outer sync runs per (stage, shard); the losses agree with the unsharded pipeline's (a tie left unsummed: 4e-2
    off), and each shard sends half of what an unsharded rank does."""
    sharded, unsharded = runs["pipeline"]["losses"], runs["pipeline-unsharded"]["losses"]
    assert runs["pipeline"]["stages"] == 2 and runs["pipeline"]["summary"]["replicas_in_sync"]
    assert len(sharded) == len(unsharded) == 8
    assert max(abs(a - b) for a, b in zip(sharded, unsharded, strict=True)) <= TOLERANCE, (sharded, unsharded)
    assert sharded[0] - min(sharded) > 2000 * TOLERANCE
    halves = [row["dp_bytes"] for row in runs["pipeline"]["iterations"]]
    wholes = [row["dp_bytes"] for row in runs["pipeline-unsharded"]["iterations"]]
    assert any(halves) and all(half == pytest.approx(whole / 2, rel=0.01) for half, whole in zip(halves, wholes))
