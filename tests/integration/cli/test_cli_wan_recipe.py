"""`geotrain plan --wan-recipe auto` records the recipe in the plan; `geotrain train --plan` runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from geotrain.bench.wan import bench_cluster
from two_gpus import LAN_GPUS_YAML, TWO_GPUS_YAML

GEOTRAIN = (sys.executable, "-m", "geotrain")


def _side_by_side(commands: list[list[str]], timeout_s: float) -> list[subprocess.CompletedProcess]:
    """The commands run at once, each to its end (all killed if one overruns `timeout_s`), as
    subprocess.run returns them."""
    launches = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for command in commands]
    try:
        outputs = [launch.communicate(timeout=timeout_s) for launch in launches]
        return [subprocess.CompletedProcess(launch.args, launch.returncode, stdout, stderr)
                for launch, (stdout, stderr) in zip(launches, outputs)]
    finally:
        for launch in launches:
            if launch.poll() is None:
                launch.kill()
                launch.communicate()


WAN_4X1_PLAN = [*GEOTRAIN, "plan", "--cluster", bench_cluster("wan-4x1"), "--stages", "1", "--replicas", "4",
                "--wan-recipe", "auto", "--compute-s", "0.125", "--recipe-steps", "60", "--recipe-max-delay", "0",
                "--json"]


@pytest.fixture(scope="module")
def wan_4x1_plans(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """The two tests' plans on wan-4x1, side by side: "recipe" (the recipe alone) and "moments" (with moment sync
    and measured codec CPU), each with the file it wrote."""
    folder = tmp_path_factory.mktemp("wan-4x1")
    extra = {"recipe": [], "moments": ["--recipe-sync-moments", "--recipe-measure-codecs"]}
    done = _side_by_side([[*WAN_4X1_PLAN, *options, "--out", str(folder / f"{name}.json")]
                          for name, options in extra.items()], 180)
    return {name: (result, folder / f"{name}.json") for name, result in zip(extra, done)}


@pytest.mark.slow  # two CLI launches (the plan beside the next test's)
@pytest.mark.timeout(300)
def test_plan_writes_the_wan_recipe_and_train_takes_its_settings(wan_4x1_plans):
    done, out = wan_4x1_plans["recipe"]
    cluster = bench_cluster("wan-4x1")
    assert done.returncode == 0, done.stderr
    recipe = json.loads(done.stdout)["wan_recipe"]
    assert recipe["version"] == 1 and recipe["compute_s"] == 0.125
    assert (recipe["sync_every"], recipe["delay"], recipe["outer_lr"], recipe["outer_momentum"]) == (5, 0, 1.0, 0.0)
    assert recipe["step_s"] == pytest.approx(0.125 + recipe["sync_s"] * recipe["fragments"] / 5)
    shown = subprocess.run([*GEOTRAIN, "train", "--cluster", cluster, "--plan", str(out), "--print-config"],
                           capture_output=True, text=True, timeout=180)
    assert shown.returncode == 0, shown.stderr
    settings = dict(line.split(" = ", 1) for line in shown.stdout.splitlines() if " = " in line)
    assert settings["sync_every"] == "5" and settings["sync_delay"] == "0"
    assert settings["fragments"] == str(recipe["fragments"])
    assert settings["dp_codecs"] == f'["{recipe["codec"]}"]'


@pytest.mark.slow  # two CLI launches (the plan beside the previous test's)
@pytest.mark.timeout(300)
def test_plan_prices_moment_sync_and_the_codecs_cpu_and_train_runs_them(wan_4x1_plans):
    done, out = wan_4x1_plans["moments"]
    cluster = bench_cluster("wan-4x1")
    assert done.returncode == 0, done.stderr
    recipe = json.loads(done.stdout)["wan_recipe"]
    assert recipe["sync_moments"] is True and recipe["moment_syncs"] == 1 and recipe["delay"] == 0
    # blocking syncs: the link time, plus the codecs' CPU (measured; for the default job's 1.3e9 values it is
    # seconds per sync on this machine's CPU: what a planner should see before choosing host-side codecs)
    extra = recipe["step_s"] - (0.125 + recipe["sync_s"] * recipe["fragments"] / recipe["sync_every"])
    assert extra > 0
    shown = subprocess.run([*GEOTRAIN, "train", "--cluster", cluster, "--plan", str(out), "--print-config"],
                           capture_output=True, text=True, timeout=180)
    assert shown.returncode == 0, shown.stderr
    settings = dict(line.split(" = ", 1) for line in shown.stdout.splitlines() if " = " in line)
    assert settings["sync_moments"] == "true" and settings["sync_every"] == str(recipe["sync_every"])
    assert settings["moment_syncs"] == "1"


MIXED = Path(__file__).resolve().parents[3] / "examples" / "clusters" / "mixed-gpus-3x2.yaml"


# compute-bound with moment sync (adaptive local steps do not run with it, and equal ones wait for the T4): the
# shares win; link-bound: the recipe. (Compute-bound without moment sync, adaptive local steps beat the shares:
# the test below.)
MIXED_CASES = [(2.0, ["--recipe-sync-moments"], "batch_shares"), (0.1, [], "wan_recipe")]


@pytest.fixture(scope="module")
def mixed_plans(tmp_path_factory) -> dict[float, tuple[subprocess.CompletedProcess, Path]]:
    """The plan of each MIXED_CASES case (by compute_s), side by side, with the file it wrote."""
    folder = tmp_path_factory.mktemp("mixed")
    job = folder / "job.yaml"
    job.write_text("name: tiny-24\nparams: 816896\nlayers: 4\nhidden: 128\nseq_len: 96\nglobal_batch: 24\n"
                   "bytes_per_value: 4\nvocab: 44\n")
    outs = [folder / f"plan-{compute_s}.json" for compute_s, _, _ in MIXED_CASES]
    done = _side_by_side([[*GEOTRAIN, "plan", "--cluster", str(MIXED), "--job", str(job), "--stages", "1",
                           "--replicas", "3", "--exclude-devices", "oregon-1,virginia-1,frankfurt-1", "--wan-recipe",
                           "auto", "--compute-s", str(compute_s), "--recipe-steps", "60", "--json", "--out", str(out),
                           "--recipe-outer-sync", "sync", *extra]  # the synchronous recipes are checked here
                          for (compute_s, extra, _), out in zip(MIXED_CASES, outs)], 180)
    return {compute_s: (result, out) for (compute_s, _, _), result, out in zip(MIXED_CASES, done, outs)}


@pytest.mark.slow  # two CLI launches (the plan beside the other case's)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("compute_s, extra, chosen", MIXED_CASES)
def test_plan_on_mixed_gpus_chooses_speed_shares_or_the_recipe_by_cost_and_train_runs_it(mixed_plans, compute_s,
                                                                                          extra, chosen):
    done, out = mixed_plans[compute_s]
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    site = plan["site_compute"]
    assert site["chosen"] == chosen and site["step_s"] == min(site["candidates_step_s"]["batch_shares"],
                                                              site["candidates_step_s"]["wan_recipe"])
    assert set(site["site_compute_fraction"]) == {"oregon-0", "virginia-0", "frankfurt-0"}
    assert (chosen in plan) and ({"batch_shares", "wan_recipe"} - {chosen}).isdisjoint(plan)
    shown = subprocess.run([*GEOTRAIN, "train", "--cluster", str(MIXED), "--plan", str(out), "--print-config"],
                           capture_output=True, text=True, timeout=180)
    assert shown.returncode == 0, shown.stderr
    settings = dict(line.split(" = ", 1) for line in shown.stdout.splitlines() if " = " in line)
    if chosen == "batch_shares":
        # by speed (replica order is the placement's: with a recipe it is searched with compute, yuan+compute)
        assert sorted(plan["batch_shares"]["samples"]) == [3, 6, 15]
        assert settings["batch_shares"] == '"speed"' and "sync_every" not in settings  # per-step DP
    else:
        assert settings["batch_shares"] == '"equal"' and settings["sync_every"] == str(plan["wan_recipe"]["sync_every"])


@pytest.mark.slow  # a plan and a 2-rank launch
@pytest.mark.timeout(300)
def test_plan_chooses_adaptive_local_steps_on_mixed_gpus_and_train_runs_them(tmp_path: Path):
    cluster, job, out = tmp_path / "cluster.yaml", tmp_path / "job.yaml", tmp_path / "plan.json"
    cluster.write_text(TWO_GPUS_YAML)
    job.write_text("name: tiny-4\nparams: 816896\nlayers: 4\nhidden: 128\nseq_len: 96\nglobal_batch: 4\n"
                   "bytes_per_value: 4\nvocab: 44\n")
    done = subprocess.run([*GEOTRAIN, "plan", "--cluster", str(cluster), "--job", str(job), "--stages", "1",
                           "--replicas", "2", "--wan-recipe", "auto", "--compute-s", "0.5", "--recipe-steps", "24",
                           "--recipe-max-delay", "0", "--recipe-outer-sync", "sync", "--json", "--out", str(out)],
                          capture_output=True, text=True, timeout=180)  # the synchronous recipe is checked here
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    recipe = plan["wan_recipe"]
    assert recipe["local_steps"] == "adaptive" and recipe["sync_every"] == 2 and recipe["fragments"] == 1
    assert recipe["local_steps_step_s"]["adaptive"] == recipe["step_s"] < recipe["local_steps_step_s"]["equal"]
    # by hand: 4 steps a period by speed (312 : 65 -> 3.31, 0.69 -> 3, 1); the T4's 1 x 0.5 s paces it
    compute = [0.5 * 65 / 312, 0.5]
    assert recipe["replica_steps"] == [3, 1]
    period = max(3 * compute[0], 1 * compute[1]) + recipe["sync_s"]
    assert recipe["step_s"] == pytest.approx(period / 2)
    expected = {"fast-0": 3 * compute[0] / period, "slow-0": 1 * compute[1] / period}
    assert plan["site_compute"]["site_compute_fraction"] == pytest.approx(expected)
    assert recipe["replica_compute_fraction"] == pytest.approx(list(expected.values()))
    runs = tmp_path / "runs"
    done = subprocess.run([*GEOTRAIN, "train", "--cluster", str(cluster), "--plan", str(out), "--steps", "4",
                           "--batch-size", "2", "--microbatches", "1", "--emulate-gpu-speed", "--time-scale", "1e-3",
                           "--run-dir", str(runs), "--json"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    from geotrain.observe.metrics import read_metrics, steps_of

    steps = steps_of(read_metrics(runs))
    inner = [sum(1 for s in steps if s["rank"] == rank) for rank in range(2)]
    assert inner[0] > inner[1] and sum(inner) == 2 * 2 * 2  # 2 periods of R x H = 4 inner steps, by speed


@pytest.mark.slow  # three CLI launches
@pytest.mark.timeout(300)
def test_plan_chooses_async_where_it_is_cheaper_and_train_runs_it_on_emulated_links(tmp_path: Path):
    (tmp_path / "lan.yaml").write_text(LAN_GPUS_YAML)
    cluster, out = str(tmp_path / "lan.yaml"), tmp_path / "plan.json"
    plan = [*GEOTRAIN, "plan", "--cluster", cluster, "--stages", "1", "--replicas", "2", "--wan-recipe", "auto",
            "--compute-s", "0.5", "--recipe-steps", "600", "--recipe-sync-moments", "--json"]
    # the two plans are independent: side by side
    done, only_sync = _side_by_side([[*plan, "--out", str(out)], [*plan, "--recipe-outer-sync", "sync"]], 180)
    # moment sync runs with equal steps only: the synchronous recipe waits for the T4; asynchronous updates do not
    assert done.returncode == 0, done.stderr
    recipe = json.loads(done.stdout)["wan_recipe"]
    assert recipe["outer_sync"] == "async" and recipe["codec"] == "none"
    assert recipe["step_s"] == recipe["outer_sync_step_s"]["async"] < recipe["outer_sync_step_s"]["sync"]
    assert only_sync.returncode == 0, only_sync.stderr
    # synchronous only: the recipe waits for the T4, and per-step DP with speed batch shares beats it
    assert "wan_recipe" not in json.loads(only_sync.stdout) and "batch_shares" in json.loads(only_sync.stdout)
    runs = tmp_path / "runs"
    trained = subprocess.run([*GEOTRAIN, "train", "--cluster", cluster, "--plan", str(out), "--steps", "12",
                              "--batch-size", "2", "--microbatches", "1", "--emulate-gpu-speed", "--time-scale", "1e-3",
                              "--run-dir", str(runs), "--json"], capture_output=True, text=True, timeout=240)
    assert trained.returncode == 0, trained.stderr[-2000:]
    from geotrain.observe.metrics import read_metrics, steps_of

    steps = steps_of(read_metrics(runs))
    inner = [sum(1 for s in steps if s["rank"] == rank) for rank in range(2)]
    # emulated links: the server serves in emulated time, so the A100 sends more outer gradients than the T4
    assert inner[0] > inner[1], inner
    for rank in range(2):  # every exchange's bytes are in a step line (rank 0's server replies after its last step
        # too) and its seconds in comm_s
        mine = [s for s in steps if s["rank"] == rank]
        sent = json.loads((runs / "emulator" / f"rank-{rank}.json").read_text())["transfers"]
        exchanged = sum(t["nbytes"] for t in sent if t["op"] == "async" and t["src_device"] != t["dst_device"])
        assert sum(s["bytes_inter"] for s in mine) == pytest.approx(exchanged) and exchanged > 0
        # rank 1's exchanges cross the link; rank 0 hosts the server, whose own round trip costs nothing, so its
        # seconds are only what it waited for the server (none on a loaded machine, where the T4 lags further)
        assert sum(s["comm_s"] for s in mine) > 0 if rank == 1 else all(s["comm_s"] >= 0 for s in mine)
