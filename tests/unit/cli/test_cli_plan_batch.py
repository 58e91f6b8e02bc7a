"""`geotrain plan` with a job whose global batch is not a multiple of the replicas: the batch is rounded to
the nearest multiple, in one note on stderr, instead of an error that asks to edit a job file."""

import json

import pytest

from geotrain.cli.main import main
from geotrain.cli.placement_args import batch_for_replicas
from geotrain.job import load_job
from paths import ROOT


@pytest.mark.parametrize("batch,replicas,rounded", [(1024, 3, 1023), (8, 3, 9), (10, 4, 12), (9, 4, 8), (2, 3, 3),
                                                    (1024, 8, 1024)])
def test_the_batch_goes_to_the_nearest_multiple_of_the_replicas(batch, replicas, rounded, capsys):
    from dataclasses import replace

    job = replace(load_job("gpt-1.3b-seed"), global_batch=batch)
    assert batch_for_replicas(job, replicas).global_batch == rounded
    err = capsys.readouterr().err
    assert (f"global_batch {batch} rounded to {rounded}" in err) == (batch != rounded)


def test_plan_three_replicas_with_the_default_and_the_example_job(capsys):
    code = main(["plan", "--cluster", "seed-geo", "--stages", "2", "--replicas", "3", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["replicas"] == 3 and json.loads(out)["global_batch"] == 1023
    assert err.strip() == ("geotrain: note: job 'gpt-1.3b-seed': global_batch 1024 rounded to 1023, the nearest "
                           "multiple of the 3 replicas (341 samples each)")
    code = main(["plan", "--cluster", "seed-geo", "--stages", "2", "--replicas", "3", "--json",
                 "--job", str(ROOT / "examples/jobs/tiny-gpt.yaml")])
    assert code == 0 and "global_batch 8 rounded to 9" in capsys.readouterr().err
