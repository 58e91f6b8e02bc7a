"""A job that does not split evenly over the layout is refused at plan time with the reason (`cost` scores a given plan and says it in a note),
instead of being planned without a word: a global batch smaller than the replicas, fewer layers than pipeline
stages. (A global batch that is not a multiple of the replicas is rounded with a note: tests/unit/cli/test_cli_plan_batch.py.)"""

from __future__ import annotations

import pytest

from geotrain.cli.main import main
from geotrain.job import Job, JobError

JOB_YAML = "name: small\nparams: 1e6\nseq_len: 96\nhidden: 128\nglobal_batch: {batch}\nlayers: {layers}\n"


@pytest.mark.parametrize("batch, layers, stages, replicas, message", [
    (8, 2, 4, 2, "2 layers cannot fill 4 pipeline stages (each stage needs at least one layer); use at most 2 stages"),
    (2, 4, 1, 4, "global_batch 2 is smaller than the 4 replicas"),
])
def test_an_uneven_job_is_refused_at_plan_time_with_the_reason(batch, layers, stages, replicas, message, tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(JOB_YAML.format(batch=batch, layers=layers))
    words = ["plan", "--cluster", "seed-geo", "--job", str(job), "--stages", str(stages), "--replicas", str(replicas)]
    code = main(words)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"geotrain: error: job 'small': {message}") and len(err.splitlines()) == 1


def test_an_even_job_fits():
    job = Job(name="ok", params=1e6, seq_len=96, hidden=128, global_batch=16, layers=4)
    for stages, replicas in ((1, 1), (4, 16), (2, 8)):
        job.check_layout_fits(stages, replicas)
    with pytest.raises(JobError, match="5 pipeline stages"):
        job.check_layout_fits(5, 1)
