"""`geotrain plan --wan-recipe auto` records the recipe in the plan; `geotrain train --plan` runs it.

Every command line of the file (seven plans, four `train --print-config`, two trainings) runs in the module fixture
`runs`, one after another in one process (tests/one_interpreter.py: its later command lines skip the seconds of
imports, its second training the fork server's start-up)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from geotrain.bench.wan import bench_cluster
from one_interpreter import OneInterpreter
from two_gpus import LAN_GPUS_YAML, TWO_GPUS_YAML

WAN_4X1_PLAN = ["plan", "--cluster", bench_cluster("wan-4x1"), "--stages", "1", "--replicas", "4", "--wan-recipe",
                "auto", "--compute-s", "0.125", "--recipe-steps", "60", "--recipe-max-delay", "0", "--json"]
MIXED = Path(__file__).resolve().parents[3] / "examples" / "clusters" / "mixed-gpus-3x2.yaml"
# compute-bound (20 s a step; the fixture plans synchronous recipes only): adaptive local steps round each replica's
# share of 5 steps a period to whole steps, which per-step DP with speed shares (its links a small part of a 20 s
# step) does not: the shares win; link-bound: the recipe. (At 2 s a step adaptive local steps beat the shares: the test below.)
MIXED_CASES = [(20.0, [], "batch_shares"), (0.1, [], "wan_recipe")]
TINY_JOB = ("name: tiny-{batch}\nparams: 816896\nlayers: 4\nhidden: 128\nseq_len: 96\nglobal_batch: {batch}\n"
            "bytes_per_value: 4\nvocab: 44\n")
Runs = tuple[Path, dict[str, subprocess.CompletedProcess]]


def _print_config(cluster: str | Path, plan: Path) -> list[str]:
    """The words of `geotrain train --print-config` of `plan` on `cluster`."""
    return ["train", "--cluster", str(cluster), "--plan", str(plan), "--print-config"]


def _trainings(folder: Path) -> dict[str, list[str]]:
    """The adaptive test's plan, the async test's two plans, then the two tests' trainings (by name, in order)."""
    (folder / "two-gpus.yaml").write_text(TWO_GPUS_YAML)
    (folder / "job-4.yaml").write_text(TINY_JOB.format(batch=4))
    (folder / "lan.yaml").write_text(LAN_GPUS_YAML)
    run = ["--batch-size", "2", "--microbatches", "1", "--emulate-gpu-speed", "--time-scale", "1e-3", "--json"]
    lan = ["plan", "--cluster", str(folder / "lan.yaml"), "--stages", "1", "--replicas", "2", "--wan-recipe", "auto",
           "--compute-s", "0.5", "--recipe-steps", "600", "--json"]
    return {
        # the synchronous recipe is checked here
        "adaptive-plan": ["plan", "--cluster", str(folder / "two-gpus.yaml"), "--job", str(folder / "job-4.yaml"),
                          "--stages", "1", "--replicas", "2", "--wan-recipe", "auto", "--compute-s", "0.5",
                          "--recipe-steps", "24", "--recipe-max-delay", "0", "--recipe-outer-sync", "sync", "--json",
                          "--out", str(folder / "adaptive-plan.json")],
        "async-plan": [*lan, "--out", str(folder / "async-plan.json")],
        "async-only-sync": [*lan, "--recipe-outer-sync", "sync"],
        "adaptive-train": ["train", "--cluster", str(folder / "two-gpus.yaml"), "--plan",
                           str(folder / "adaptive-plan.json"), "--steps", "4", *run, "--run-dir",
                           str(folder / "adaptive-runs")],
        "async-train": ["train", "--cluster", str(folder / "lan.yaml"), "--plan", str(folder / "async-plan.json"),
                        "--steps", "12", *run, "--run-dir", str(folder / "async-runs")]}


def _plans(folder: Path) -> dict[str, list[str]]:
    """The wan-4x1 plans ("recipe": the recipe alone; "moments": with moment sync and measured codec CPU) and the
    mixed-GPU cases' ("mixed-COMPUTE_S"), each followed by the `--print-config` of the plan it wrote (NAME-config)."""
    (folder / "job-24.yaml").write_text(TINY_JOB.format(batch=24))
    commands = {}
    for name, options in {"recipe": [], "moments": ["--recipe-sync-moments", "--recipe-measure-codecs"]}.items():
        commands[name] = [*WAN_4X1_PLAN, *options, "--out", str(folder / f"{name}.json")]
        commands[f"{name}-config"] = _print_config(bench_cluster("wan-4x1"), folder / f"{name}.json")
    for compute_s, extra, _ in MIXED_CASES:
        out = folder / f"mixed-{compute_s}.json"
        commands[f"mixed-{compute_s}"] = [
            "plan", "--cluster", str(MIXED), "--job", str(folder / "job-24.yaml"), "--stages", "1", "--replicas", "3",
            "--exclude-devices", "oregon-1,virginia-1,frankfurt-1", "--wan-recipe", "auto", "--compute-s",
            str(compute_s), "--recipe-steps", "60", "--json", "--out", str(out),
            "--recipe-outer-sync", "sync", *extra]  # the synchronous recipes are checked here
        commands[f"mixed-{compute_s}-config"] = _print_config(MIXED, out)
    return commands


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    """(the folder, each command line's outcome by name): the trainings' plans and trainings, then the other plans
    each followed by the `--print-config` of what it wrote."""
    folder = tmp_path_factory.mktemp("wan-recipe")
    commands = {**_trainings(folder), **_plans(folder)}
    return folder, dict(zip(commands, OneInterpreter(list(commands.values()), folder, "runs").results(), strict=True))


def _settings(done: subprocess.CompletedProcess) -> dict[str, str]:
    """The `key = value` lines of a `train --print-config` that exited 0."""
    assert done.returncode == 0, done.stderr
    return dict(line.split(" = ", 1) for line in done.stdout.splitlines() if " = " in line)


@pytest.mark.slow  # a plan and its --print-config (the module's fixture)
@pytest.mark.timeout(300)
def test_plan_writes_the_wan_recipe_and_train_takes_its_settings(runs):
    done = runs[1]["recipe"]
    assert done.returncode == 0, done.stderr
    recipe = json.loads(done.stdout)["wan_recipe"]
    assert recipe["version"] == 1 and recipe["compute_s"] == 0.125
    assert (recipe["sync_every"], recipe["delay"], recipe["outer_lr"], recipe["outer_momentum"]) == (5, 0, 1.0, 0.0)
    assert recipe["step_s"] == pytest.approx(0.125 + recipe["sync_s"] * recipe["fragments"] / 5)
    settings = _settings(runs[1]["recipe-config"])
    assert settings["sync_every"] == "5" and settings["sync_delay"] == "0"
    assert settings["fragments"] == str(recipe["fragments"])
    assert settings["dp_codecs"] == f'["{recipe["codec"]}"]'


@pytest.mark.slow  # a plan and its --print-config (the module's fixture)
@pytest.mark.timeout(300)
def test_plan_prices_moment_sync_and_the_codecs_cpu_and_train_runs_them(runs):
    done = runs[1]["moments"]
    assert done.returncode == 0, done.stderr
    recipe = json.loads(done.stdout)["wan_recipe"]
    assert recipe["sync_moments"] is True and recipe["moment_syncs"] == 1 and recipe["delay"] == 0
    # blocking syncs: the link time, plus the codecs' CPU (measured; for the default job's 1.3e9 values it is
    # seconds per sync on this machine's CPU: what a planner should see before choosing host-side codecs)
    extra = recipe["step_s"] - (0.125 + recipe["sync_s"] * recipe["fragments"] / recipe["sync_every"])
    assert extra > 0
    settings = _settings(runs[1]["moments-config"])
    assert settings["sync_moments"] == "true" and settings["sync_every"] == str(recipe["sync_every"])
    assert settings["moment_syncs"] == "1"


@pytest.mark.slow  # a plan and its --print-config (the module's fixture)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("compute_s, extra, chosen", MIXED_CASES)
def test_plan_on_mixed_gpus_chooses_speed_shares_or_the_recipe_by_cost_and_train_runs_it(runs, compute_s, extra,
                                                                                          chosen):
    done = runs[1][f"mixed-{compute_s}"]
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    site = plan["site_compute"]
    assert site["chosen"] == chosen and site["step_s"] == min(site["candidates_step_s"]["batch_shares"],
                                                              site["candidates_step_s"]["wan_recipe"])
    assert set(site["site_compute_fraction"]) == {"oregon-0", "virginia-0", "frankfurt-0"}
    assert (chosen in plan) and ({"batch_shares", "wan_recipe"} - {chosen}).isdisjoint(plan)
    settings = _settings(runs[1][f"mixed-{compute_s}-config"])
    if chosen == "batch_shares":
        # by speed (replica order is the placement's: with a recipe it is searched with compute, yuan+compute)
        assert sorted(plan["batch_shares"]["samples"]) == [3, 6, 15]
        assert settings["batch_shares"] == '"speed"' and "sync_every" not in settings  # per-step DP
    else:
        assert settings["batch_shares"] == '"equal"' and settings["sync_every"] == str(plan["wan_recipe"]["sync_every"])


@pytest.mark.slow  # a plan and a 2-rank launch (the module's fixture)
@pytest.mark.timeout(300)
def test_plan_chooses_adaptive_local_steps_on_mixed_gpus_and_train_runs_them(runs):
    done = runs[1]["adaptive-plan"]
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
    done = runs[1]["adaptive-train"]
    assert done.returncode == 0, done.stderr[-2000:]
    from geotrain.observe.metrics import read_metrics, steps_of

    steps = steps_of(read_metrics(runs[0] / "adaptive-runs"))
    inner = [sum(1 for s in steps if s["rank"] == rank) for rank in range(2)]
    assert inner[0] > inner[1] and sum(inner) == 2 * 2 * 2  # 2 periods of R x H = 4 inner steps, by speed


@pytest.mark.slow  # two plans and a 2-rank launch (the module's fixture)
@pytest.mark.timeout(300)
def test_plan_chooses_async_where_it_is_cheaper_and_train_runs_it_on_emulated_links(runs):
    done, only_sync = runs[1]["async-plan"], runs[1]["async-only-sync"]
    # on a fast link asynchronous updates reach the target sooner than adaptive local steps (whose blocking syncs
    # wait on the link; both keep the A100 busy)
    assert done.returncode == 0, done.stderr
    recipe = json.loads(done.stdout)["wan_recipe"]
    assert recipe["outer_sync"] == "async" and recipe["codec"] == "none"
    charged = recipe["outer_sync_charged_s"]
    assert recipe["step_s"] == recipe["outer_sync_step_s"]["async"] and charged["async"] < charged["sync"]
    assert only_sync.returncode == 0, only_sync.stderr
    # synchronous only: adaptive local steps, the step the async candidate was charged against
    synchronous = json.loads(only_sync.stdout)["wan_recipe"]
    assert synchronous["outer_sync"] == "sync" and synchronous["local_steps"] == "adaptive"
    assert synchronous["step_s"] == recipe["outer_sync_step_s"]["sync"]
    trained, run_dir = runs[1]["async-train"], runs[0] / "async-runs"
    assert trained.returncode == 0, trained.stderr[-2000:]
    from geotrain.observe.metrics import read_metrics, steps_of

    steps = steps_of(read_metrics(run_dir))
    inner = [sum(1 for s in steps if s["rank"] == rank) for rank in range(2)]
    # emulated links: the server serves in emulated time, so the A100 sends more outer gradients than the T4
    assert inner[0] > inner[1], inner
    for rank in range(2):  # every exchange's bytes are in a step line (rank 0's server replies after its last step
        # too) and its seconds in comm_s
        mine = [s for s in steps if s["rank"] == rank]
        sent = json.loads((run_dir / "emulator" / f"rank-{rank}.json").read_text())["transfers"]
        exchanged = sum(t["nbytes"] for t in sent if t["op"] == "async" and t["src_device"] != t["dst_device"])
        assert sum(s["bytes_inter"] for s in mine) == pytest.approx(exchanged) and exchanged > 0
        # rank 1's exchanges cross the link; rank 0 hosts the server, whose own round trip costs nothing, so its
        # seconds are only what it waited for the server (none on a loaded machine, where the T4 lags further)
        assert sum(s["comm_s"] for s in mine) > 0 if rank == 1 else all(s["comm_s"] >= 0 for s in mine)
