"""`geotrain train --plan` with sharded replicas (plan --shards 2): 2 sites x 2 shards, each site's slot two
processes holding FSDP2 shards of the tiny model, DiLoCo per shard across the sites, on emulated links.

Runs (module fixture, 8 steps each): the sharded plan and the unsharded one (one process per site, the same
replicas) with --sync-every 4 --fragments 2 --sync-delay 1, no codec and a validation every 4 steps, then the
sharded plan with int8-block, and with adaptive local steps; two runs after one another in each of two processes
side by side (tests/one_interpreter.py: a process's second launch skips its seconds of imports).
Tolerance of the float check: both runs compute in float32 and differ only in how a step's gradient is summed
(FSDP reduce-scatters the mean of the two shards' gradients of 4 sequences each; the unsharded rank sums the 8 at
once), so their losses first differ in the last bits (2.4e-7 = 1 ulp of a loss near 3.8) and AdamW's normalised
steps carry that through 8 steps without growth: measured at most 9.2e-6 (the last step, after two outer syncs);
the bound 1e-4 is 10x that and 2000x below the loss's fall over the run, so a run that did not equal the unsharded
one (a shard on the wrong rows, a gradient not averaged over the slot) fails it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from one_interpreter import OneInterpreter, results_of
from runtime_2x2 import CLUSTER_YAML

SHARDED = {"method": "manual", "stages": 1, "replicas": 2, "assignment": [[0, 2]],
           "shards": {"k": 2, "devices": [[[0, 1], [2, 3]]]}}
UNSHARDED = {"method": "manual", "stages": 1, "replicas": 2, "assignment": [[0, 2]]}
STREAMING = ("--sync-every", "4", "--fragments", "2", "--sync-delay", "1", "--outer-lr", "1", "--outer-momentum", "0")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _train(root: Path, name: str, plan: dict, *flags: str) -> list[str]:
    """The words of `geotrain train` for `plan` (written into `root` as NAME.json) and `flags`."""
    (root / f"{name}.json").write_text(json.dumps(plan))
    return ["train", "--run-dir", "none", "--cluster", str(root / "cluster.yaml"), "--plan", str(root / f"{name}.json"),
            "--steps", "8", "--json", *flags]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("sharded-train")
    (root / "cluster.yaml").write_text(CLUSTER_YAML)
    emulated = ("--time-scale", "1e-3", "--eval-every", "4")
    commands = {"sharded": _train(root, "sharded", SHARDED, *STREAMING, *emulated),
                "unsharded": _train(root, "unsharded", UNSHARDED, *STREAMING, *emulated),
                "int8": _train(root, "int8", SHARDED, *STREAMING, "--dp-codec", "int8-block", "--time-scale", "0"),
                "adaptive": _train(root, "adaptive", SHARDED, "--sync-every", "4", "--local-steps", "adaptive",
                                   "--outer-lr", "1", "--outer-momentum", "0", "--time-scale", "0")}
    parts = [("sharded", "adaptive"), ("unsharded", "int8")]
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
    assert worst <= 1e-4, (sharded, unsharded)
    assert sharded[0] - min(sharded) > 2000 * 1e-4  # the check can fail: the loss moved far beyond it
    # validation: every shard of a slot scores the replica's windows through FSDP2's forward
    validation = [(v["step"], v["loss"]) for v in runs["sharded"]["validation"]]
    expected = [(v["step"], v["loss"]) for v in runs["unsharded"]["validation"]]
    assert [step for step, _ in validation] == [step for step, _ in expected] == [4, 8]
    assert max(abs(a[1] - b[1]) for a, b in zip(validation, expected)) <= 1e-4, (validation, expected)


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
    K). They differ by AdamW's step counters only (one 4-byte scalar per parameter tensor); a shard holding the
    whole model, or a residual counted or kept where it should not be, would be off by a megabyte."""
    counters = {}
    for name, k, residual in (("sharded", 2, 0), ("unsharded", 1, 0), ("int8", 2, 4)):
        memory = runs[name]["summary"]["memory"]
        ranks = memory["per_rank"]
        assert len(ranks) == 2 * k
        for rank in ranks:
            assert rank["predicted_state"] == memory["predicted_state_per_stage"][0]
            assert 0 <= rank["state"] - rank["predicted_state"] <= 4 * 64, (name, rank)  # tiny: < 64 tensors
            assert rank["weights"] == rank["gradients"] and rank["optimizer"] >= 2 * rank["weights"]
            assert rank["sync"] == (4 + residual) * rank["weights"] / 4, (name, rank)  # the anchor (and residual)
            assert rank["peak_rss"] > rank["state"]
        counters[name] = ranks[0]["weights"]
    assert counters["sharded"] * 2 == counters["unsharded"]  # each shard: half the model (the tiny one splits evenly)


def test_the_shards_of_a_slot_send_what_the_unsharded_replica_sends(runs):
    """Per outer sync each shard sends its 1/K of the stage to its peer: together the slot's K shards put on the WAN
    the bytes the unsharded rank puts there (fp32, no codec: exactly; a block codec differs by the blocks a shard's cut
    opens: measured +8 bytes in 1,659,320 with int8-block, docs/guide/slow-links.md)."""
    sharded, unsharded = runs["sharded"]["bytes"]["dp_per_stage"][0], runs["unsharded"]["bytes"]["dp_per_stage"][0]
    assert sharded > 0 and 2 * sharded == unsharded
