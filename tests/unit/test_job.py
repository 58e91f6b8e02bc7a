"""Job files and presets: derived bytes, exponent numbers, clear errors."""

import pytest

from geotrain.job import GPT_13B_SEED, JobError, load_job


def test_job_file_reads_exponent_numbers(tmp_path):
    path = tmp_path / "gpt.yaml"
    path.write_text("params: 1.3e9\nseq_len: 2048\nhidden: 2048\nglobal_batch: 1024\n")
    job = load_job(path)
    assert job.name == "gpt"
    assert job.params == 1.3e9
    assert job.dp_bytes(4) == GPT_13B_SEED.dp_bytes(4)
    assert job.pp_bytes(8) == GPT_13B_SEED.pp_bytes(8)


@pytest.mark.parametrize(
    "text, message",
    [
        ("params: 1e9\nseq_len: 2048\nhidden: 2048\n", "missing key 'global_batch'"),
        ("params: 1e9\nseq_len: 2048\nhidden: 2048\nglobal_batch: 8\nbatch: 3\n", "unknown key 'batch'"),
        ("params: -1\nseq_len: 2048\nhidden: 2048\nglobal_batch: 8\n", "params must be a number > 0, got -1"),
        ("params: [1\n", "not valid YAML/JSON"),
        ("- 1\n- 2\n", "top level must be a mapping"),
    ],
)
def test_bad_job_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(JobError, match=message) as info:
        load_job(path)
    assert str(path) in str(info.value)


def test_unknown_job_spec_lists_presets():
    with pytest.raises(JobError, match="gpt-1.3b-seed"):
        load_job("no-such-job")
