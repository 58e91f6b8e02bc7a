"""`geotrain bench pipeline`'s scoring and row choice (geotrain.bench.pipeline, cli/bench_pipeline.py)."""

import pytest

from geotrain.bench.pipeline import DEFAULT_ROWS, PipelineBenchError, bench_cluster, steps_to_target
from geotrain.cli.bench_pipeline import rows_of
from geotrain.cli.main import main


def test_steps_to_target_is_the_first_window_mean_at_or_below_it():
    losses = [3.0, 2.0, 2.2, 1.9, 1.8, 1.7]
    assert steps_to_target(losses, 2.0, 1) == 2
    assert steps_to_target(losses, 2.0, 3) == 5  # (2.2 + 1.9 + 1.8) / 3 = 1.97 after step 5
    assert steps_to_target(losses, 1.0, 3) is None


def test_the_cut_crosses_a_100_mbit_link_or_stays_inside_a_site():
    cluster = bench_cluster()
    assert cluster.region_of.tolist() == [0, 0, 1, 1]
    assert cluster.bandwidth_gbps[0, 2] == pytest.approx(0.1) and cluster.bandwidth_gbps[0, 1] == pytest.approx(10.0)
    assert [(row.pp_codec, row.across) for row in DEFAULT_ROWS[:2]] == [("none", False), ("none", True)]


def test_codecs_choose_the_across_rows_and_refused_codecs_are_one_line(capsys):
    rows = rows_of("none, int4-block:block_size=32")
    assert [(row.label, row.pp_codec, row.across) for row in rows] == [
        ("local, fp32", "none", False), ("across, fp32", "none", True),
        ("across, int4-block:block_size=32", "int4-block:block_size=32", True)]
    with pytest.raises(PipelineBenchError, match="payload layout depends on the data"):
        rows_of("topk")
    # an item k=v continues the codec before it (a delta spec's parameters); --no-local leaves the local row out
    assert [row.pp_codec for row in rows_of("int2-block,delta:codec=int2-block,grad=int4-block,fp16", local=False)] \
        == ["int2-block", "delta:codec=int2-block,grad=int4-block", "fp16"]
    assert [row.pp_codec for row in rows_of("delta:grad=topk-lowbit:fraction=0.0625/bits=4,first=int4-block,fp16",
                                            local=False)] == [
        "delta:grad=topk-lowbit:fraction=0.0625/bits=4,first=int4-block", "fp16"]  # a nested spec's ':' too
    assert main(["bench", "pipeline", "--codecs", ",", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["geotrain: error: --codecs: give one or more activation codecs, got ','"]
