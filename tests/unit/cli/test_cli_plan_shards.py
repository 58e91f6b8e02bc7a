"""`geotrain plan --shards K`: sharded slots in the plan file, read back by cost and emulate."""

import json

import pytest

from geotrain.cli.device_args import rank_devices
from geotrain.cli.main import main
from geotrain.plan import Plan, PlanError

CLUSTER = """name: a100-2x4
regions:
  - {name: oregon, devices: 4, gpu: A100, intra: {gbps: 100, ms: 0.05}}
  - {name: virginia, devices: 4, gpu: A100, intra: {gbps: 100, ms: 0.05}}
links:
  - {between: [oregon, virginia], gbps: 1, ms: 35}
"""
JOB_7B = "name: gpt-7b\nparams: 6.7e9\nlayers: 32\nhidden: 4096\nseq_len: 2048\nglobal_batch: 64\n"
JOB_7B_2_LAYERS = "name: gpt-7b-2\nparams: 6.7e9\nlayers: 2\nhidden: 4096\nseq_len: 2048\nglobal_batch: 64\n"
JOB_1B = "name: gpt-1b\nparams: 1.0e9\nlayers: 24\nhidden: 2048\nseq_len: 2048\nglobal_batch: 64\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    for name, text in (("c.yaml", CLUSTER), ("j.yaml", JOB_7B), ("j2.yaml", JOB_7B_2_LAYERS), ("j1b.yaml", JOB_1B)):
        (root / name).write_text(text)
    return root


def test_a_fixed_layout_places_slots_site_by_site_and_cost_reads_them(files, capsys):
    c, j, out = str(files / "c.yaml"), str(files / "j.yaml"), str(files / "p.json")
    assert main(["plan", "--cluster", c, "--job", j, "--stages", "1", "--replicas", "2", "--shards", "4",
                 "--cost-model", "schedule", "--json", "--out", out]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["shards"]["k"] == 4
    assert sorted(map(sorted, plan["shards"]["devices"][0])) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [slot[0] for slot in plan["shards"]["devices"][0]] == plan["assignment"][0]
    # the stage's 13.4 GB of gradients as 4 exchanges of 3.35 GB at once over 1 Gbit/s links
    assert plan["cost"]["dp"] == pytest.approx(2 * (0.035 + 8 * 13.4e9 / 2 / 4e9))
    assert main(["cost", "--cluster", c, "--plan", out, "--cost-model", "schedule", "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["shards"] == 4 and scored["cost"]["total"] == pytest.approx(plan["cost"]["total"])
    assert rank_devices(out, None, 8) == [d for slot in Plan.load(out).shards.devices[0] for d in slot]


def test_too_few_slots_are_refused_in_one_line(files, capsys):
    c, j = str(files / "c.yaml"), str(files / "j.yaml")
    assert main(["plan", "--cluster", c, "--job", j, "--stages", "2", "--replicas", "2", "--shards", "4"]) == 2
    assert "need 4 slots of 4 devices of one site, and the sites hold 2" in capsys.readouterr().err


def test_auto_configuration_shards_a_model_no_device_holds(files, capsys):
    """2 layers of a 7B model: a stage's AdamW state (53.6 GB) fits no 40 GiB A100, so K is chosen."""
    c, j = str(files / "c.yaml"), str(files / "j2.yaml")
    assert main(["plan", "--cluster", c, "--job", j, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["shards"]["k"] > 1
    assert plan["memory_per_device_bytes"] <= 40 * 2**30
    assert plan["devices_used"] == plan["stages"] * plan["replicas"] * plan["shards"]["k"]
    assert Plan.from_json(plan).k == plan["shards"]["k"]


def test_shards_auto_weighs_k_with_the_layout(files, capsys):
    c, j = str(files / "c.yaml"), str(files / "j.yaml")
    assert main(["plan", "--cluster", c, "--job", j, "--json"]) == 0
    unsharded = json.loads(capsys.readouterr().out)
    assert "shards" not in unsharded  # K = 1 suffices: the plan of before
    assert main(["plan", "--cluster", c, "--job", j, "--shards", "auto", "--json"]) == 0
    weighed = json.loads(capsys.readouterr().out)
    assert weighed["iteration_s"] <= unsharded["iteration_s"]
    assert {row.get("shards", {"k": 1})["k"] for row in weighed["candidates"]} - {1}


def test_old_plans_load_with_one_device_per_slot_and_bad_shards_are_refused():
    assert Plan.from_json({"stages": 1, "replicas": 2, "assignment": [[0, 4]]}).k == 1
    good = {"stages": 1, "replicas": 2, "assignment": [[0, 4]], "shards": {"k": 2, "devices": [[[0, 1], [4, 5]]]}}
    assert Plan.from_json(good).to_json() == good
    for shards, message in (({"k": 2, "devices": [[[0, 1], [4, 1]]]}, "more than once"),
                            ({"k": 2, "devices": [[[1, 0], [4, 5]]]}, "must start with"),
                            ({"k": 0, "devices": []}, "shards.k must be"),
                            ({"k": 2, "devices": [[[0], [4, 5]]]}, "must have shape")):
        with pytest.raises(PlanError, match=message):
            Plan.from_json({**good, "shards": shards})


def test_a_sharded_plan_pays_for_every_device_of_every_slot(files, capsys):
    priced = files / "priced.yaml"
    priced.write_text(CLUSTER + "prices:\n  gpu_hour: {A100: 2.0}\n  egress_per_gb: {default: 0.1}\n")
    assert main(["plan", "--cluster", str(priced), "--job", str(files / "j.yaml"), "--stages", "1", "--replicas", "2",
                 "--shards", "4", "--cost-model", "schedule", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    money = plan["money"]
    assert money["gpu_usd_per_step"] == pytest.approx(8 * 2.0 * plan["cost"]["total"] / 3600)
    # the bytes leaving each site are those of one device per slot (4 shards' exchanges of 1/4 of the stage each):
    # the 13.4 GB stage's reduce-scatter and all-gather halves
    assert money["egress_gb_per_step"] == pytest.approx({"oregon": 13.4, "virginia": 13.4})


def test_a_re_plan_on_the_live_devices_names_the_full_clusters_devices(files, capsys):
    """(A 1B job: two shards of the 7B job's 107 GB of AdamW state do not fit a 40 GB A100, which plan refuses.)"""
    c, j = str(files / "c.yaml"), str(files / "j1b.yaml")
    assert main(["plan", "--cluster", c, "--job", j, "--stages", "1", "--replicas", "2", "--shards", "2",
                 "--exclude-devices", "oregon-0,virginia-1", "--cost-model", "schedule", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    used = [d for row in plan["shards"]["devices"] for slot in row for d in slot]
    assert not {0, 5} & set(used) and len(set(used)) == 4
