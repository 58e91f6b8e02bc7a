"""The composition table's running cells end to end, in one launch: the largest set of settings the table lets
run together (8 settings: 28 of its running pairs at once). The refused cells and every running cell at config
validation: tests/unit/runtime/test_runtime_composition.py. Other running cells launched by existing tests
(their launches are reused, not repeated): --elastic alone (test_runtime_elastic_partition.py, with emulated links)
and with --sync-every (integration/runtime/test_runtime_elastic.py), with a plan of 2 stages
(test_runtime_elastic_pipeline.py), with
--fragments, --sync-delay and --dp-codec (test_runtime_elastic_streaming.py, also on a sharded plan), with
--local-steps adaptive
(test_runtime_elastic_adaptive.py, also with --sync-delay and --sync-moments on a plan of 2 stages), with
--checkpoint-every, --resume and --stop-after (test_runtime_elastic_replan_resume.py), with --batch-shares
(test_runtime_elastic_batch_shares.py), with --sync-moments and with --optimizer onebit-adam
(test_runtime_elastic_moments.py; 1-bit Adam with a killed group: test_runtime_elastic.py), with --outer-sync async
and async-hierarchical
(test_runtime_elastic_async.py), with a sharded plan (test_runtime_elastic_sharded.py), with --dp-hierarchical
(test_runtime_elastic_hierarchical.py), with
emulated links (integration/observe/test_observe_runs.py); --dp-hierarchical with --sync-delay and --sync-moments (and
--sync-every, --fragments, --dp-codec: test_runtime_hierarchical.py), with --optimizer onebit-adam (the same file); --sync-every with --local-steps adaptive
(test_runtime_adaptive_local_steps.py, also with --dp-hierarchical, --sync-delay and --sync-moments), also on a plan
of 2 stages (test_runtime_adaptive_pipeline.py), and with --outer-sync async-hierarchical (integration/cli/
test_cli_outer_sync.py); a sharded plan with --checkpoint-every, --stop-after and --resume
(test_runtime_sharded_resume.py), with --eval-local (test_runtime_sharded_eval_local.py), with --sync-moments, with
--dp-hierarchical, with a plan of 2 stages, with --local-steps adaptive, with --fragments, --sync-delay, --dp-codec
and emulated links (test_runtime_sharded_train.py), with --outer-sync async (test_runtime_sharded_train.py);
--outer-sync async-hierarchical with --checkpoint-every, --stop-after and --resume (test_runtime_resume_outer_syncs.py),
with a plan of 2 stages and --fragments (integration/cli/test_cli_outer_sync.py); --outer-sync async with a plan of 2
stages,
--checkpoint-every, --stop-after, --resume and --fragments (test_runtime_resume_outer_syncs.py); --outer-sync async and
async-hierarchical with --sync-moments (test_runtime_resume_outer_syncs.py, with the settings above; --outer-sync
async with --sync-moments on a sharded plan: test_runtime_sharded_train.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from itertools import combinations

import pytest

from geotrain.cli.main import build_parser
from geotrain.cli.train_cmd import config_from_args
from geotrain.runtime.composition import SETTING, pair_refusal
from runtime_2x2 import write_job_files

TOGETHER = ("pipeline", "diloco", "fragments", "delay", "moments", "codec", "stop-after", "links")
FLAGS = ["--model", "tiny-2layer", "--seq-len", "16", "--batch-size", "2", "--microbatches", "2", "--steps", "8",
         "--sync-every", "4", "--fragments", "2", "--sync-delay", "1", "--sync-moments", "--dp-codec", "int8-block",
         "--stop-after", "6", "--time-scale", "0.05"]  # on the 2 x 2 plan (pipeline)


@pytest.mark.timeout(300)
def test_eight_settings_the_table_lets_run_together_run_in_one_launch(tmp_path):
    assert all(pair_refusal(a, b) is None for a, b in combinations(TOGETHER, 2))
    files = write_job_files(tmp_path)
    args = ["train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"], *FLAGS, "--json"]
    config = config_from_args(build_parser(args).parse_args(args))
    assert [name for name in TOGETHER if not SETTING[name].on(config)] == []  # the launch holds every one
    done = subprocess.run([sys.executable, "-m", "geotrain", *args], capture_output=True, text=True, timeout=280,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(done.stdout)
    assert len(run["losses"]) == 6 and all(math.isfinite(loss) for loss in run["losses"])  # stopped after 6 of 8
    assert run["summary"]["replicas_in_sync"] is True and run["stages"] == 2
