"""`geotrain plan --wan-recipe auto`: the layout and the recipe chosen together, memory checked, the choice explained.

The cluster is a new user's three sites (docs' walkthrough): tokyo 4 H100, frankfurt 2 A100 + 2 T4, saopaulo 4 L4,
100 Gbit/s inside a site, 0.2-1 Gbit/s between; the job a 1B GPT.
"""

import json
from pathlib import Path

import pytest

from geotrain.cli.main import main

SITES = (("tokyo", ["H100"] * 4), ("frankfurt", ["A100", "A100", "T4", "T4"]), ("saopaulo", ["L4"] * 4))
WAN = {("tokyo", "frankfurt"): (0.5, 230), ("tokyo", "saopaulo"): (0.2, 260), ("frankfurt", "saopaulo"): (1.0, 190)}
JOB = "name: gpt-1b\nparams: 1.0e9\nlayers: 24\nhidden: 2048\nseq_len: 2048\nglobal_batch: 512\n"


def link(a: str, b: str) -> tuple[float, float]:
    if a == b:
        return 100.0, 0.1
    return WAN.get((a, b)) or WAN[(b, a)]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    """The three sites in the dense form (one GPU type per device) and the job."""
    root = tmp_path_factory.mktemp("geo3")
    devices = [(f"{site}{i}", site, gpu) for site, gpus in SITES for i, gpu in enumerate(gpus)]
    rows = [[link(a[1], b[1]) for b in devices] for a in devices]
    doc = {"name": "geo3", "devices": [{"name": n, "region": r, "gpu": g} for n, r, g in devices],
           "bandwidth_gbps": [[gbps for gbps, _ in row] for row in rows],
           "latency_ms": [[0.0 if i == j else ms for j, (_, ms) in enumerate(row)] for i, row in enumerate(rows)]}
    (root / "geo3.json").write_text(json.dumps(doc))
    (root / "gpt1b.yaml").write_text(JOB)
    return root / "geo3.json", root / "gpt1b.yaml"


def plan_json(capsys, *args: str) -> tuple[dict, str]:
    """`plan ARGS --json`: the plan and what it wrote on stderr."""
    assert main(["plan", *args, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_the_natural_call_chooses_a_layout_with_its_recipe_and_explains_it(files, capsys):
    cluster, job = files
    plan, _ = plan_json(capsys, "--cluster", str(cluster), "--job", str(job), "--wan-recipe", "auto")
    assert "wan_recipe" in plan or "batch_shares" in plan  # the flag is no longer ignored without --stages/--replicas
    rows = plan["candidates"]
    charged = [row["recipe"]["charged_s"] for row in rows]
    assert charged == sorted(charged)  # ranked by the recipe's charged step, the chosen first
    assert len({(row["stages"], row["replicas"]) for row in rows}) == len(rows)  # one row per layout
    if plan["replicas"] > 1:
        assert plan["wan_recipe"]["step_s"] == pytest.approx(rows[0]["recipe"]["step_s"])
    # every device it uses holds a stage with the outer optimizer's state: AdamW 16 + outer 8 bytes per parameter
    assert plan["memory_per_device_bytes"] >= 24 * 1e9 / plan["stages"]
    chosen, *rest = plan["explanation"]
    assert chosen.startswith(f"Chosen: {plan['stages']} x {plan['replicas']}")
    assert rest[0].startswith("Next: ") and rest[-1].split(":")[0] in ("Memory", "A link", "Compute")
    # without the recipe the same call prices per-step data parallelism and says so
    plain, _ = plan_json(capsys, "--cluster", str(cluster), "--job", str(job))
    assert "wan_recipe" not in plain and "per-step data parallelism" in plain["explanation"][0]


def test_a_fixed_layout_with_a_recipe_is_placed_by_compute_and_memory(files, capsys):
    cluster, job = files
    plan, notes = plan_json(capsys, "--cluster", str(cluster), "--job", str(job), "--stages", "1", "--replicas", "3",
                            "--wan-recipe", "auto")
    assert plan["cost_model"] == "yuan+compute"  # "yuan" has no compute: it put all three replicas on the L4s
    assert sorted(plan["assignment"][0]) in ([0, 1, 2], [0, 1, 3], [0, 2, 3], [1, 2, 3])  # tokyo's H100s
    # the T4s and L4s cannot hold a replica: left out, said in one note, and in the plan's explanation
    assert plan["explanation"][0].startswith("Chosen: 1 x 3 (WAN recipe) on 3 of 12 devices in tokyo")
    assert plan["explanation"][-1].startswith("Memory: 6 idle devices (L4 (26 GB), T4 (17 GB))")
    assert "6 devices cannot hold" in notes and "frankfurt2 (T4)" in notes and "saopaulo0 (L4)" in notes
    assert main(["plan", "--cluster", str(cluster), "--job", str(job), "--stages", "1", "--replicas", "12",
                 "--wan-recipe", "auto"]) == 2
    error = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("geotrain: note:")]
    assert len(error) == 1 and error[0].startswith("geotrain: error: --stages 1 --replicas 12 with --wan-recipe auto")
    assert "L4 (26 GB) x4" in error[0] and "T4 (17 GB) x2" in error[0] and "only 6 of 12 devices" in error[0]


def test_a_recipe_with_zero_sharding_is_refused(files, capsys):
    cluster, job = files
    assert main(["plan", "--cluster", str(cluster), "--job", str(job), "--wan-recipe", "auto", "--zero", "1"]) == 2
    assert "--zero" in capsys.readouterr().err


def test_a_plan_by_a_communication_only_model_says_so(files, capsys):
    cluster, job = files
    plan, _ = plan_json(capsys, "--cluster", str(cluster), "--job", str(job), "--stages", "2", "--replicas", "2",
                        "--method", "pipeline-local")
    assert plan["cost_model"] == "yuan"
    assert plan["explanation"][-1].startswith("Links: the cost model prices communication only")
    assert "--cost-model yuan+compute or schedule" in plan["explanation"][-1]


def test_a_fixed_layout_on_mixed_gpus_is_placed_by_speed_by_default(files, capsys):
    """No --cost-model on GPUs of several types: "schedule" (compute at each GPU's speed), so 1 x 3 lands on
    tokyo's H100s; "yuan" (links only) puts it on saopaulo's L4s (the plan "schedule" prices ~8x slower)."""
    cluster, job = files
    chosen, _ = plan_json(capsys, "--cluster", str(cluster), "--job", str(job), "--stages", "1", "--replicas", "3")
    links_only, _ = plan_json(capsys, "--cluster", str(cluster), "--job", str(job), "--stages", "1", "--replicas",
                              "3", "--cost-model", "yuan")
    devices = {d: i for i, d in enumerate(f"{site}{i}" for site, gpus in SITES for i in range(len(gpus)))}
    assert chosen["cost_model"] == "schedule" and links_only["cost_model"] == "yuan"
    assert sorted(chosen["assignment"][0]) == [devices["tokyo0"], devices["tokyo1"], devices["tokyo2"]]
    assert all(d >= devices["saopaulo0"] for d in links_only["assignment"][0])
    # 720 placements of 3 slots on the 10 devices that hold a replica (the T4s do not: below): scored them all
    # (search/every_placement.py), the optimum proven
    assert chosen["details"]["found_by"] == "every-placement" and chosen["details"]["tried"][0]["placements"] == 720
    assert chosen["lower_bound"] == chosen["cost"]["total"] and chosen["gap"] == 0
    assert "tokyo" in chosen["explanation"][0]


def test_a_fixed_layout_without_a_recipe_is_memory_checked_too(files, capsys):
    """Per-step data parallelism of the 1B job needs 19.8 GB a device (AdamW, no outer state): the 16 GB T4s are
    left out of a layout the others can hold, and 1 x 12, which needs them, is refused in one line naming them."""
    cluster, job = files
    plan, notes = plan_json(capsys, "--cluster", str(cluster), "--job", str(job), "--stages", "1", "--replicas", "8")
    assert "--stages 1 --replicas 8: 2 devices cannot hold 19.8 GB" in notes and "frankfurt2 (T4)" in notes
    devices = [f"{site}{i}" for site, gpus in SITES for i in range(len(gpus))]
    assert not {"frankfurt2", "frankfurt3"} & {devices[d] for d in plan["assignment"][0]}
    assert main(["plan", "--cluster", str(cluster), "--job", str(job), "--stages", "1", "--replicas", "12"]) == 2
    error = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("geotrain: note:")]
    assert error == ["geotrain: error: --stages 1 --replicas 12 needs 19.8 GB on every device (weights, gradients, "
                     "AdamW state of its stage, one sequence's activations), and only 10 of 12 devices hold it; too "
                     "small: T4 (17 GB) x2. Use more stages (--stages), shard each slot over a site's devices "
                     "(--shards K), or let the planner choose the layout (no --stages/--replicas)"]


def test_with_the_outer_state_in_host_memory_the_l4s_hold_a_replica_and_the_layout_is_planned(files, capsys):
    """--outer-state host: the outer sync's anchor, momentum and residual (12 bytes per parameter) live in host
    memory (train --outer-state host), so a device holds 16 bytes per parameter, one sequence's activations and its
    fp32 logits (1e9 x 16 + 3.42e9 + 0.41e9 = 19.8 GB): the L4s (26 GB) now hold a replica and 1 x 10 is planned
    where it was refused (1e9 x 28 + 3.83e9 = 31.8 GB: only the 6 H100s and A100s); the T4s (17 GB) still cannot.
    The plan records the option for `train --plan`, and its recipe is synchronous."""
    cluster, job = files
    layout = ["--cluster", str(cluster), "--job", str(job), "--stages", "1", "--replicas", "10", "--wan-recipe", "auto",
              "--method", "local-search"]  # (placed by a quick method: what is tested is which devices hold a replica)
    assert main(["plan", *layout]) == 2
    assert "only 6 of 12 devices" in capsys.readouterr().err
    plan, notes = plan_json(capsys, *layout, "--outer-state", "host")
    assert plan["outer_state"] == "host" and plan["wan_recipe"]["outer_sync"] == "sync"
    assert "2 devices cannot hold 19.8 GB" in notes and "frankfurt2 (T4)" in notes and "saopaulo0" not in notes
    assert len(set(plan["assignment"][0])) == 10
    assert main(["plan", "--cluster", str(cluster), "--job", str(job), "--outer-state", "host"]) == 2
    assert capsys.readouterr().err.strip().endswith("add --wan-recipe auto")
