"""An asynchronous run (`--outer-sync async`) reads each rank's learning rate at the run's progress (the equal
schedule's step of the global model the rank holds), not at the rank's own step count: on the bench's 4.8x GPU
spread the A100 takes more steps than the run's and the T4 fewer, yet all follow one schedule."""

from __future__ import annotations

import pytest

from geotrain.bench.hetero import DEFAULT_ROWS, hetero_config, train_row
from geotrain.bench.wan import bench_cluster
from geotrain.cluster import load_cluster
from geotrain.data import world_tokens
from geotrain.models import lr_at

STEPS = 20


@pytest.mark.slow  # a 4-rank emulated run
@pytest.mark.timeout(400)
def test_every_rank_reads_the_learning_rate_at_the_global_models_progress():
    config = hetero_config(steps=STEPS, eval_every=STEPS)
    row = next(r for r in DEFAULT_ROWS if r.kind == "async")
    records, _ = train_row(row, load_cluster(bench_cluster(config.cluster)), config, world_tokens(0))
    steps = [r for r in records if "lr" in r]
    for record in steps:
        assert record["lr"] == pytest.approx(lr_at(record["progress_step"], STEPS, config.lr), rel=1e-12)
    # a rank's first period starts from the initial model: the schedule's step 0 throughout, whatever its own step
    first = [r for r in steps if r["step"] < row.sync_every]
    assert {r["lr"] for r in first} == {lr_at(0, STEPS, config.lr)}
    # the fast GPU runs past the run's steps; its last steps are at the run's end, not at a step it never reaches
    assert max(r["step"] for r in steps) >= STEPS
    assert max(r["progress_step"] for r in steps) >= STEPS // 2
