"""`geotrain train --elastic --outer-sync async`: replica groups as TCP clients of the global model's server
(runtime/elastic/async_group.py). A fault-free run ends equal on every group; a run whose non-host group is
SIGKILLed at 1 s and whose host group is SIGKILLed at 2 s of training finishes without a global restart: the
killed client rejoins, the survivor is elected the new host from its copy, and the killed host rejoins as a client;
the same run then cuts the links of that client (group 0) at 2.5 s and of the new host (group 1) at 4 s, 1 s each: the
client's messages wait for each heal (as TCP retransmits), no one is elected, and the run ends on one model; it runs
--sync-moments, so every push carries its group's AdamW second moments, the elected host serves its copy's global ones,
and every group's AdamW ends holding the final model's; and --fragments 2, so every push carries one fragment and the
elected host serves a fragment server from its copy's fragments (sync/async_fragments.py, runtime/elastic/
fragment_copy.py).
`--outer-sync async-hierarchical` (runtime/elastic/async_regions.py), 2 regions x 2 groups: the host of region 1's
server (group 2) SIGKILLed at 1 s and the host of region 0's and the global model's (group 0) at 2 s: three elections,
no global restart, one final model; it runs --fragments 2, so every region's server and the global model's are fragment
servers, each region merging its fragments upstream in turn (sync/async_region.py). The fault-free run is two launches:
one that stops at step 12 (--stop-after, checkpoints at 6 and 12 by the global model's host) and its --resume to the end
(runtime/elastic/async_checkpoint.py). Two processes side by side in one fixture (the hierarchical run after the
fault-free launches, in their interpreter). The fault-free run and the hierarchical one emulate the links (--time-scale >
0: runtime/elastic/links.py SocketPacing): the fault-free run's groups sit in two regions, and each of group 1's
messages to the host (group 0) takes latency + bytes / bandwidth of the cluster file's link between them.
A sharded plan (K = 2 devices per slot: a group is 2 processes holding FSDP2 shards, each the client of its position's
server; runtime/elastic/async_group.py, Positions), its host group SIGKILLed at 0.5 s: one election picks the survivor
for both positions, each serving from its own copy; that launch stops at step 30 (--stop-after, each position's server
writing its shard of the checkpoint; both launches with --sync-moments and --fragments 2, each position's server a
fragment server of [its parameters | v]) and a fault-free --resume continues it to the end on emulated links (each
position's messages paced, the group's FSDP2 collectives on its devices' links); both run after the hierarchical run,
in its interpreter. The same plan with `--outer-sync async-hierarchical` (a region per group: east, west) and --fragments
2, its host group SIGKILLed at 0.5 s: each position of region 1's host group serves its part of the global model from
its own copy, the restarted group hosts region 0's server again; it runs last in the first interpreter (beside the
killed run's 500 steps)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from geotrain.cost.async_outer import STALENESS_BOUND
from geotrain.sync.async_step import pause_updates, progress_steps, run_budget
from one_interpreter import OneInterpreter, results_of
from paths import ROOT

pytest.importorskip("torchft")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CLUSTER = str(ROOT / "tests" / "data" / "wan-2x2.yaml")
H = 3
STEPS = {"plain": 30, "killed": 500, "regions": 200, "sharded": 60}
"""The killed run trains long enough for both kills to land (5-10 s of compute per group on this loaded 2-core machine;
the restarted group 1 joins, holding a copy, about 0.3 s after its kill)."""
KILLS = "kill-site:every=100s,first=1s,site=1,count=1;kill-site:every=100s,first=2s,site=host,count=1"
CUTS = "partition:site=0,at=2.5s,for=1s;partition:site=1,at=4s,for=1s"
"""After the kills (the killed run's 500 steps train 5-10 s on this machine, each cut holding the run ~1 s more):
group 0, a client again, cut; then group 1, the elected host."""
SHARDED_PLAN = {"method": "manual", "stages": 1, "replicas": 2, "assignment": [[0, 2]],
                "shards": {"k": 2, "devices": [[[0, 1], [2, 3]]]}}
"""Group 0 on east's two devices, group 1 on west's: a group is its slot's 2 shard processes."""
SHARDED_KILL = "kill-site:every=100s,first=0.5s,site=host,count=1"
"""The host group (0) killed once 0.5 s of training passed (the 60 steps train about 17 s on this loaded 2-core
machine; the killed group is back about 3.6 s after its kill, while the survivor trains on alone)."""
SHARDED_REGIONS_STEPS = 60
"""The sharded plan's hierarchical run (its host group killed as SHARDED_KILL's; about 12 s on this loaded machine)."""
SHARDED_STOP = 30
"""The sharded plan's killed launch stops at step 30 with a checkpoint there; its --resume trains on to 60."""
REGION_KILLS = "kill-site:every=100s,first=1s,site=2,count=1;kill-site:every=100s,first=2s,site=host,count=1"
"""Group 2 hosts region 1's server, group 0 region 0's and the global model's (each tier's epoch 0): site=host, which
the launcher looks up when the kill is due (async_regions.global_model_host), is group 0 in both runs."""
REGIONS_FAULT_FREE_VAL = 2.890
"""Validation loss of the fault-free hierarchical run (the regions run without --chaos), mean of 6 (sd 0.149:
asynchronous runs are not reproducible run to run; docs/history/fault_tolerance.md)."""
REGIONS_LOSS_BOUND = 0.35
"""The fault-free runs' own spread (max - min 0.34): a killed run lies among them."""
REGIONS_EVERY = 50
"""The hierarchical run's checkpoints (by the global model's host, re-elected at 2 s): 50, 100, 150 and the end's."""
STOP, EVERY = 12, 6
"""The fault-free run's first launch stops at step 12 (--stop-after) with checkpoints at 6 and 12."""
PLAIN_VAL = 3.130
"""Validation loss of the uninterrupted fault-free run (30 steps, one launch), mean of 6 (sd 0.055, max - min 0.147);
7 runs stopped at 12 and resumed: mean 3.088 (sd 0.068), the farthest 0.170 from it
(docs/guide/surviving-failures.md)."""
PLAIN_LOSS_BOUND = 0.30
"""Twice the uninterrupted runs' own spread: a resumed run lies among them (asynchrony is not bit-exact)."""
TIME_SCALE = {"plain": 0.1, "regions": 0.05}
"""The emulated links' time scales (a message across the regions: 80 ms + its 1.16 MB at 100 Mbit/s, 0.17 s)."""
LATENCY_S, BANDWIDTH_BPS = 0.080, 0.1e9
"""wan-2x2.yaml's link between its regions."""
FLAGS = ["--model", "tiny-2layer", "--seq-len", "16", "--microbatches", "1", "--batch-size", "2", "--time-scale", "0",
         "--sync-every", str(H), "--outer-sync", "async", "--elastic", "--heartbeat-timeout", "1.5",
         "--comm-timeout", "30", "--eval-windows", "4", "--run-dir", "none", "--json"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic-async")
    plan, plan02, plan4 = tmp / "plan.json", tmp / "plan02.json", tmp / "plan4.json"
    sharded_plan = tmp / "sharded.json"
    sharded_plan.write_text(json.dumps(SHARDED_PLAN))
    plan.write_text(json.dumps({"stages": 1, "replicas": 2, "assignment": [[0, 1]]}))
    plan02.write_text(json.dumps({"stages": 1, "replicas": 2, "assignment": [[0, 2]]}))  # east, west
    plan4.write_text(json.dumps({"stages": 1, "replicas": 4, "assignment": [[0, 1, 2, 3]]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    base = ["train", "--cluster", CLUSTER, "--plan", str(plan), *FLAGS]
    hierarchical = [word if word != "async" else "async-hierarchical" for word in FLAGS]
    regions = ["train", "--cluster", CLUSTER, "--plan", str(plan4), *hierarchical, "--steps", str(STEPS["regions"]),
               "--chaos", REGION_KILLS, "--time-scale", str(TIME_SCALE["regions"]),
               "--checkpoint-dir", str(tmp / "ckpt-regions"), "--checkpoint-every", str(REGIONS_EVERY),
               "--fragments", "2"]
    plain = ["train", "--cluster", CLUSTER, "--plan", str(plan02), *FLAGS, "--steps", str(STEPS["plain"]),
             "--checkpoint-dir", str(tmp / "ckpt"), "--time-scale", str(TIME_SCALE["plain"])]
    stopped = [*plain, "--checkpoint-every", str(EVERY), "--stop-after", str(STOP)]
    sharded = ["train", "--cluster", CLUSTER, "--plan", str(sharded_plan), *FLAGS,
               "--steps", str(STEPS["sharded"]), "--checkpoint-dir", str(tmp / "ckpt-sharded"), "--sync-moments",
               "--fragments", "2"]
    sharded_regions = ["train", "--cluster", CLUSTER, "--plan", str(sharded_plan), *hierarchical,
                       "--steps", str(SHARDED_REGIONS_STEPS), "--chaos", SHARDED_KILL, "--fragments", "2"]
    first = OneInterpreter([stopped, [*plain, "--resume"], regions,
                            [*sharded, "--chaos", SHARDED_KILL, "--checkpoint-every", str(SHARDED_STOP),
                             "--stop-after", str(SHARDED_STOP)],
                            [*sharded, "--resume", "--time-scale", str(TIME_SCALE["plain"])], sharded_regions],
                           tmp, "first", env)
    second = OneInterpreter([[*base, "--steps", str(STEPS["killed"]), "--chaos", f"{KILLS};{CUTS}", "--sync-moments",
                              "--fragments", "2"]],
                            tmp, "second", env)
    (stopped, plain, regional, shards, resharded, sharded_regional), (killed,) = results_of([first, second])
    runs = {}
    for name, done in (("stopped", stopped), ("plain", plain), ("regions", regional), ("killed", killed),
                       ("sharded", shards), ("sharded_resumed", resharded), ("sharded_regions", sharded_regional)):
        assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stderr}"
        runs[name] = json.loads(done.stdout)
    saved = {name: {int(p.parent.name[5:]): torch.load(p, weights_only=False)["dp"]["asynchronous"]
                    for p in (tmp / name).glob("step-*/rank-0000.pt")} for name in ("ckpt", "ckpt-regions")}
    shards = {(int(p.parent.name[5:]), int(p.name[5:9])): torch.load(p, weights_only=False)
              for p in (tmp / "ckpt-sharded").glob("step-*/rank-*.pt")}
    return {**runs, "checkpoints": sorted(p.relative_to(tmp).as_posix() for p in (tmp / "ckpt").glob("step-*/*")),
            "saved": saved["ckpt"], "saved_regions": saved["ckpt-regions"], "saved_shards": shards,
            "sharded_checkpoints": sorted(p.relative_to(tmp).as_posix() for p in (tmp / "ckpt-sharded").glob("step-*/*"))}


def _final_updates(run: dict) -> list[int]:
    return [records[-1]["global_updates"] for records in run["group_records"].values()]


def test_a_fault_free_elastic_async_run_ends_on_one_model_holding_its_budget(runs):
    summary = runs["plain"]["summary"]
    assert summary["groups_finished"] == [0, 1] and summary["replica_failures"] == 0
    assert summary["max_param_diff_across_replicas"] == 0.0 and summary["replicas_in_sync"] is True
    assert summary["elections"] == 0 and summary["rejoins"] == 0
    budget = run_budget(STEPS["plain"], H, 2)
    updates = _final_updates(runs["plain"])
    assert updates[0] == updates[1] and budget <= updates[0] < budget + 2  # a last request begun below it counts
    # the final global model's outer gradients, its samples (x H x the batch of 2) and the seconds to it (bench chaos)
    assert updates[0] <= summary["global_updates"] < budget + 2
    assert summary["samples"] == summary["global_updates"] * H * 2 and summary["train_s"] > 0
    # the stopped launch's checkpoints and the end's, each once (by the host), named by the equal schedule's steps
    assert runs["checkpoints"] == [f"ckpt/step-{step:06d}/{name}" for step in (EVERY, STOP, STEPS["plain"])
                                   for name in ("manifest.json", "rank-0000.pt")]


def test_a_stopped_elastic_async_run_checkpoints_at_its_hosts_updates_and_resumes_every_group_from_it(runs):
    """Step c's checkpoint holds the global model once its count reached ceil(c x R / H) (one update may bring a
    merged batch of 2); the stopped launch ends both groups on that checkpoint's model, and the resumed launch
    starts every group at its step and count, and ends at the run's budget."""
    saved, budget = runs["saved"], run_budget(STEPS["plain"], H, 2)
    for step in (EVERY, STOP):
        assert not saved[step].get("finished") and saved[step]["elastic"]
        assert pause_updates(step, H, 2) <= saved[step]["updates"] < pause_updates(step, H, 2) + 2
    assert saved[EVERY]["version"] < saved[STOP]["version"]
    assert _final_updates(runs["stopped"]) == [saved[STOP]["updates"]] * 2  # the stop's budget: later ones discarded
    assert runs["stopped"]["summary"]["max_param_diff_across_replicas"] == 0.0
    for records in runs["plain"]["group_records"].values():
        assert records[0]["step"] == progress_steps(saved[STOP]["updates"], H, 2)
        assert records[0]["global_updates"] >= saved[STOP]["updates"] and records[-1]["global_updates"] >= budget
    assert abs(runs["plain"]["summary"]["val_loss"] - PLAIN_VAL) < PLAIN_LOSS_BOUND


def test_each_message_of_a_group_to_the_host_takes_latency_plus_its_bytes_over_the_links_bandwidth(runs):
    """Group 1 (west) is the host's (group 0, east) client across the regions; group 0's own messages stay in its
    process. Every exchange of group 1 counts its request and the reply: the join (a header out, the model back) in
    its first record, a request with an outer gradient and the model back in each synced record."""
    records = runs["plain"]["group_records"]
    assert all(r["sent_bytes"] == 0.0 and r["link_s"] == 0.0 for r in records["0"])
    client = records["1"][:-1]  # the last also holds the final exchange
    first, synced = client[0], [r for r in client if r["synced"]]
    assert not first["synced"] and synced  # the host's own client, with no link to sleep, may send more of the budget
    header = 40
    model = first["sent_bytes"] - 2 * header
    assert model > 0 and all(r["sent_bytes"] == 2 * (header + model) for r in synced)
    assert all(r["sent_bytes"] == 0.0 for r in client[1:] if not r["synced"])
    for r in [first, *synced]:
        assert r["inter_region_bytes"] == r["sent_bytes"]
        # two messages, each latency + its bytes over the bandwidth (emulated seconds)
        assert r["link_s"] == pytest.approx(2 * LATENCY_S + 8 * r["sent_bytes"] / BANDWIDTH_BPS, rel=1e-9)
    # slept by the client in wall time x the scale (a lower bound: sleeps never end early)
    assert all(r["comm_s"] >= TIME_SCALE["plain"] * r["link_s"] for r in synced)


def test_a_killed_client_group_rejoins_and_the_run_never_restarts_globally(runs):
    summary = runs["killed"]["summary"]
    assert summary["kills"] == 2 and summary["replica_failures"] == 2 and summary["restarts"] == [1, 1]
    assert summary["rejoins"] == 2 and summary["global_restarts"] == 0 and summary["groups_finished"] == [0, 1]
    assert len(summary["recovery_s"]) == 2 and all(0 < s < 30 for s in summary["recovery_s"])
    for group, records in runs["killed"]["group_records"].items():
        steps = [r["step"] for r in records]
        assert steps == list(range(steps[0], steps[0] + len(steps))), group  # since its last start: none repeated


def test_a_killed_host_group_is_replaced_by_the_freshest_copy_and_the_run_ends_on_one_model(runs):
    summary = runs["killed"]["summary"]
    assert summary["elections"] == 1  # the host's kill only: a client's kill elects no one
    # the lost host ran ahead of the survivor's copy by at most the staleness bound; the survivor resent at most
    # its one request in flight
    assert 0 <= summary["lost_updates"] <= STALENESS_BOUND and summary["resent_updates"] <= 1
    assert summary["max_param_diff_across_replicas"] == 0.0 and summary["replicas_in_sync"] is True
    budget = run_budget(STEPS["killed"], H, 2)
    updates = _final_updates(runs["killed"])
    assert updates[0] == updates[1] and budget <= updates[0] < budget + 2
    assert summary["val_loss"] < runs["plain"]["summary"]["val_loss"]  # 500 steps trained past 30
    # --sync-moments and --fragments 2: each push is one fragment's [outer gradient | the group's AdamW v] (the two
    # fragments' pushes together 2 x the plain run's whole-model push), and every group's AdamW ends holding the final
    # model's v, which the elected host's fragment server merged on from its copy's
    pushes = {r["dp_bytes"] for records in runs["killed"]["group_records"].values() for r in records} - {0}
    (whole,) = {r["dp_bytes"] for r in runs["plain"]["group_records"]["1"]} - {0}
    assert len(pushes) == 2 and sum(pushes) == 2 * whole
    finals = [records[-1] for records in runs["killed"]["group_records"].values()]
    assert all(r["moments_loaded"] >= 1 and r["moments_sha256"] == r["held_moments_sha256"] for r in finals)
    assert len({r["moments_sha256"] for r in finals}) == 1


def test_killed_hosts_of_region_servers_are_replaced_inside_their_regions_and_the_run_ends_on_one_model(runs):
    summary = runs["regions"]["summary"]
    assert summary["kills"] == 2 and summary["replica_failures"] == 2 and summary["restarts"] == [1, 0, 1, 0]
    assert summary["rejoins"] == 2 and summary["global_restarts"] == 0 and summary["groups_finished"] == [0, 1, 2, 3]
    # region 1's server, region 0's and the global model's: each re-elected once
    assert summary["elections"] == 3
    # lost for good: each lost region server's unmerged updates (at most merge_every = 2 region updates of at most 2
    # outer gradients) and the global updates the lost host applied beyond the elected copy (staleness bound, 2 each)
    assert 0 <= summary["lost_updates"] <= 2 * 2 * 2 + 2 * STALENESS_BOUND
    assert summary["resent_updates"] <= 3  # a request in flight per surviving group of a lost region, and region 1's
    assert summary["max_param_diff_across_replicas"] == 0.0 and summary["replicas_in_sync"] is True
    budget = run_budget(STEPS["regions"], H, 4)
    # each group stops once its region's count reaches the budget; a last delta begun below it counts whole
    assert all(budget <= updates < budget + 4 for updates in _final_updates(runs["regions"]))
    assert budget <= summary["global_updates"] < budget + 4 and summary["samples"] == summary["global_updates"] * H * 2
    assert summary["val_loss"] < REGIONS_FAULT_FREE_VAL + REGIONS_LOSS_BOUND
    # between the regions: only the region servers' requests to the global model's host and its replies
    records = [r for group in runs["regions"]["group_records"].values() for r in group]
    assert sum(r["inter_region_bytes"] for r in records) > 0
    assert all(0 <= r["inter_region_bytes"] <= r["sent_bytes"] for r in records)
    # --fragments 2: a group's push to its region's server is one fragment's outer gradient (the two together the
    # plain run's whole-model push)
    pushes = {r["dp_bytes"] for r in records} - {0}
    (whole,) = {r["dp_bytes"] for r in runs["plain"]["group_records"]["1"]} - {0}
    assert len(pushes) == 2 and sum(pushes) == whole
    # the global model's checkpoints, by whichever group hosts it (the newest 3 kept: --keep-checkpoints)
    saved = runs["saved_regions"]
    assert sorted(saved) == [100, 150, STEPS["regions"]]
    for step in (100, 150):  # a region's delta carries up to 4; an elected host writes at its first update past it
        need = pause_updates(step, H, 4)
        assert saved[step]["elastic"] and need <= saved[step]["updates"] < need + 2 * 4
    assert saved[100]["version"] < saved[150]["version"]


def test_a_cut_client_and_a_cut_host_hold_the_clients_messages_until_the_heal_and_elect_no_one(runs):
    """Group 0 (a client after the host's kill) waits while its own links are cut and while the host's are; the
    host's own client (group 1) crosses no link and never waits: it trains on to the staleness bound."""
    summary = runs["killed"]["summary"]
    assert summary["partitions"] == 2 and summary["elections"] == 1  # the host's kill only: a cut host is alive
    assert summary["replica_failures"] == 2 and summary["rejoins"] == 2  # the kills' only: each cut < --comm-timeout
    records = runs["killed"]["group_records"]
    assert sum(r["cut_wait_s"] for r in records["0"]) > 0
    assert all(r["cut_wait_s"] == 0.0 for r in records["1"])


def test_a_killed_host_group_of_two_shard_processes_is_replaced_by_one_election_for_both_positions(runs):
    """Each position (shard) of the survivor serves its part of the global model from its own copy; the groups end on
    one model at every position (each shard against the same shard of the other group)."""
    summary = runs["sharded"]["summary"]
    assert summary["kills"] == 1 and summary["replica_failures"] == 1 and summary["restarts"] == [1, 0]
    assert summary["elections"] == 1 and summary["global_restarts"] == 0 and summary["rejoins"] == 1
    assert summary["groups_finished"] == [0, 1]
    assert summary["max_param_diff_across_replicas"] == 0.0 and summary["replicas_in_sync"] is True
    stop = pause_updates(SHARDED_STOP, H, 2)  # the launch stops at step 30's count
    updates = _final_updates(runs["sharded"])
    assert updates[0] == updates[1] and stop <= updates[0] < stop + 2
    for records in runs["sharded"]["group_records"].values():  # both positions digested at each push
        assert all(len(r["stage_params_sha256"]) == 2 for r in records if r["synced"])


def test_a_stopped_launch_of_two_shard_processes_checkpoints_every_position_and_its_resume_continues_it(runs):
    """Each position's server writes its shard of step 30 (the last one in, the manifest) holding its part of the
    global model at step 30's count; the resumed launch starts every group at that step from each position's part,
    ends at the run's budget on one model at every position, and its host group writes the end's shards. On emulated
    links group 1's positions (west) each pace their messages to the host (group 0, east); the host's stay local."""
    assert runs["sharded_checkpoints"] == [f"ckpt-sharded/step-{step:06d}/{name}" for step in (SHARDED_STOP, 60)
                                           for name in ("manifest.json", "rank-0000.pt", "rank-0001.pt")]
    saved = runs["saved_shards"]
    stop, budget = pause_updates(SHARDED_STOP, H, 2), run_budget(STEPS["sharded"], H, 2)
    for rank in (0, 1):
        state = saved[(SHARDED_STOP, rank)]
        held = state["dp"]["asynchronous"]
        assert state["slot"]["shard"] == rank and not held.get("finished") and held["elastic"]
        assert stop <= held["updates"] < stop + 2
        # the stage's weights are the global model's part, as the shard's FSDP2 records
        weights = torch.cat([v["dtensor_local"].reshape(-1) for v in state["stage"].values() if isinstance(v, dict)])
        assert held["model"].numel() == 2 * weights.numel()  # --sync-moments: [parameters | v]
        assert torch.equal(weights, held["model"][:weights.numel()].to(weights.dtype))
        assert saved[(STEPS["sharded"], rank)]["dp"]["finished"]
    resumed = runs["sharded_resumed"]
    summary = resumed["summary"]
    assert summary["groups_finished"] == [0, 1] and summary["replica_failures"] == 0 and summary["elections"] == 0
    assert summary["max_param_diff_across_replicas"] == 0.0 and summary["replicas_in_sync"] is True
    start = min(saved[(SHARDED_STOP, rank)]["dp"]["asynchronous"]["updates"] for rank in (0, 1))
    for records in resumed["group_records"].values():
        assert records[0]["step"] == progress_steps(start, H, 2)
        assert records[0]["global_updates"] >= start and records[-1]["global_updates"] >= budget
    updates = _final_updates(resumed)
    assert updates[0] == updates[1] and budget <= updates[0] < budget + 2
    records = resumed["group_records"]
    assert all(r["sent_bytes"] == 0.0 and r["link_s"] == 0.0 for r in records["0"])
    # each push: a request and a reply across the regions, each carrying one fragment of a position's part, for both
    # positions; the pushes alternate the 2 fragments, so every 2 pushes carry each position's part twice each way
    part_bytes = saved[(SHARDED_STOP, 0)]["dp"]["asynchronous"]["model"].numel() * 4
    pushes = [r for r in records["1"] if r["synced"]]
    assert all(r["link_s"] >= 2 * LATENCY_S for r in pushes)
    assert sum(r["sent_bytes"] for r in pushes) >= 2 * (len(pushes) - 1) * part_bytes
    for group in records.values():  # --sync-moments: each group's AdamW holds the final model's v
        assert group[-1]["moments_loaded"] > 0 and group[-1]["moments_sha256"] == group[-1]["held_moments_sha256"]


def test_a_killed_host_group_of_two_shard_processes_with_region_servers_is_replaced_for_every_position(runs):
    """async-hierarchical on groups of 2 shard processes, a region per group: the host group (group 0: region 0's
    server and the global model's, at both positions) killed; region 1's host group is elected for the global model at
    both positions at once, each serving from its own copy, and the restarted group 0 hosts region 0's servers again
    (no copy: from the global model); every position of both groups ends on its part of one global model."""
    summary = runs["sharded_regions"]["summary"]
    assert summary["kills"] == 1 and summary["replica_failures"] == 1 and summary["restarts"] == [1, 0]
    assert summary["global_restarts"] == 0 and summary["rejoins"] == 1 and summary["groups_finished"] == [0, 1]
    # the global model's host (one vote, both positions' tiers following it) and region 0's (its only group's)
    assert summary["elections"] == 2
    assert summary["max_param_diff_across_replicas"] == 0.0 and summary["replicas_in_sync"] is True
    budget = run_budget(SHARDED_REGIONS_STEPS, H, 2)
    updates = _final_updates(runs["sharded_regions"])
    assert updates[0] == updates[1] and budget <= updates[0] < budget + 2
    for records in runs["sharded_regions"]["group_records"].values():  # both positions digested at each push
        assert all(len(r["stage_params_sha256"]) == 2 for r in records if r["synced"])
