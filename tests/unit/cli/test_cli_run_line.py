"""`geotrain train` says what it runs (sync, codecs, recipe, batch per replica against the plan's job), and a
short `--sync-every` run with DiLoCo's outer settings says what they are and why they may hurt it."""

from geotrain.cli.run_line import async_validation_note, outer_settings_note, what_runs
from geotrain.cluster import load_cluster
from geotrain.plan import Plan
from geotrain.runtime import RuntimeConfig

CLUSTER = load_cluster("seed-geo")
PLAN = Plan.from_json({"stages": 1, "replicas": 2, "assignment": [[0, 8]], "job": "gpt-1.3b-seed"})


def config(**settings):
    return RuntimeConfig.of(CLUSTER, [[0, 8]], **settings)


def test_the_line_names_the_layout_the_sync_the_codec_and_both_batches():
    line = what_runs(config(dp_codec="int8-block", batch_size=8), PLAN)
    assert line.startswith("runs: 1 stage x 2 replicas on seed-geo; sync: gradients averaged every step through "
                           "int8-block, error feedback;")
    assert "8 sequences per replica (--batch-size) x 2 = 16 per step" in line
    assert "priced for job 'gpt-1.3b-seed', global batch 1024, which sets no batch here" in line


def test_local_sgd_and_a_recipe_are_named():
    line = what_runs(config(sync_every=5, outer_lr=1.0, outer_momentum=0.0, fragments=2, sync_delay=1), PLAN)
    assert "local SGD / DiLoCo every 5 steps (outer lr 1, momentum 0), outer deltas through fp32, 2 fragments" in line
    recipe = Plan.from_json({**PLAN.to_json(), "wan_recipe": {"sync_every": 5}})
    assert "(the plan's WAN recipe)" in what_runs(config(sync_every=5), recipe)
    assert "outer state in host memory" in what_runs(config(sync_every=5, outer_state="host"), PLAN)
    assert "host memory" not in line


def test_an_asynchronous_outer_sync_is_named_as_such():
    line = what_runs(config(sync_every=4, outer_sync="async"), PLAN)
    assert ("sync: asynchronous DiLoCo (async: each replica sends its outer gradient to the global model's server "
            "every 4 of its steps and goes on without waiting; outer lr 0.7, momentum 0.9), the whole model in fp32 "
            "both ways (no codec);") in line
    assert "local SGD" not in line
    assert "asynchronous DiLoCo (async-hierarchical:" in what_runs(config(sync_every=4,
                                                                          outer_sync="async-hierarchical"), PLAN)


def test_sync_every_alone_on_a_short_run_says_its_outer_settings_and_why():
    note = outer_settings_note(config(sync_every=5, steps=30))
    assert note.startswith("geotrain: note: --sync-every 5: outer Nesterov lr 0.7, momentum 0.9")
    assert "this run has 6" in note and "--outer-lr 1 --outer-momentum 0" in note
    assert outer_settings_note(config(sync_every=5, steps=30, outer_lr=1.0, outer_momentum=0.0)) is None
    assert outer_settings_note(config(sync_every=2, steps=400)) is None  # 200 outer steps: DiLoCo's regime
    assert outer_settings_note(config(steps=30)) is None


def test_eval_every_with_asynchronous_updates_says_the_global_model_is_scored_at_the_end_only():
    note = async_validation_note(config(sync_every=2, outer_sync="async", eval_every=4, steps=16))
    assert note == ("geotrain: note: --eval-every 4 with --outer-sync async: the global model is validated at the end "
                    "only (the ranks are at different steps: no mid-run collective); --eval-local also has each "
                    "replica score the global model it gets back, every 4 of its steps")
    for quiet in (config(sync_every=2, eval_every=4, steps=16),  # synchronous: every 4 steps, as asked
                  config(sync_every=2, outer_sync="async", eval_every=4, eval_local=True, steps=16),
                  config(sync_every=2, outer_sync="async", eval_every=16, steps=16),  # the end is all it asked
                  config(sync_every=2, outer_sync="async", steps=16)):
        assert async_validation_note(quiet) is None
