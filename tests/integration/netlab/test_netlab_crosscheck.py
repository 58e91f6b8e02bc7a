"""Emulated vs shaped cross-check: output parsing, medians, and one real run (root, netlab)."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geotrain.cli.main import main
from geotrain.cluster import cluster_from_dict
from geotrain.netlab.crosscheck import CrossCheckCase, CrossCheckRow, cross_check, steady_median, step_lines
from paths import ROOT

pytestmark = pytest.mark.serial  # measures wall time or bandwidth: runs alone (Makefile)

EXAMPLES = ROOT / "examples"


@given(st.lists(st.tuples(st.floats(0.0, 1e3, allow_nan=False), st.floats(1e-6, 1e3, allow_nan=False)), max_size=6))
def test_step_lines_read_back_what_the_examples_print(steps):
    text = "noise\n" + "".join(f"step {k} loss {loss:.8f} time {sec:.4f}s\nW1203 socket warning\n"
                              for k, (loss, sec) in enumerate(steps))
    got = step_lines(text)
    assert [k for k, _, _ in got] == list(range(len(steps)))
    assert [loss for _, loss, _ in got] == [f"{loss:.8f}" for loss, _ in steps]
    assert [s for _, _, s in got] == [float(f"{sec:.4f}") for _, sec in steps]


def test_steady_median_leaves_out_step_zero():
    assert steady_median([9.0, 1.0, 3.0, 2.0]) == 2.0
    assert steady_median([5.0]) == 5.0


def test_a_row_compares_emulated_to_shaped_and_losses_exactly():
    row = CrossCheckRow("x", 1.1, 1.0, (2.0, 1.1), (1.5, 1.0), ("0.5", "0.4"), ("0.5", "0.4"))
    assert row.ratio == pytest.approx(1.1) and row.losses_equal
    assert not CrossCheckRow("x", 1.0, 1.0, (), (), ("0.5",), ("0.50000001",)).losses_equal


def test_crosscheck_needs_two_steps(capsys):
    assert main(["bench", "netlab", "--cluster", "seed-geo", "--crosscheck", "--steps", "1"]) == 2
    assert "--steps" in capsys.readouterr().err


LAB = cluster_from_dict({"name": "xc", "regions": [{"name": "a", "devices": 1}, {"name": "b", "devices": 1}],
                         "links": [{"between": ["a", "b"], "gbps": 0.05, "ms": 0.05}],
                         "defaults": {"intra": {"gbps": 1, "ms": 0.05}}})


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="netlab needs root")
def test_gpipe_emulated_and_shaped_agree_on_a_bandwidth_bound_link_with_equal_losses():
    """2 ranks across a 50 Mbit/s link, 4 micro-batches of 256 KB each way: ~0.34 s of link time per
    step. The losses must be identical; the times are reported, not asserted (noisy machine)."""
    case = CrossCheckCase("gpipe", str(EXAMPLES / "pipeline_train.py"),
                          ("--steps", "3", "--hidden", "512", "--batch", "512", "--microbatches", "4"))
    (row,) = cross_check(LAB, [0, 1], [case], timeout_s=240)
    assert row.losses_equal and len(row.emulated_steps_s) == len(row.shaped_steps_s) == 3
    assert row.emulated_s > 0.3 and row.shaped_s > 0.3  # both really pay the link
    ours = [name for name in os.listdir("/run/netns") if name.startswith(f"gt{os.getpid()}-")] \
        if os.path.isdir("/run/netns") else []
    assert ours == []  # the lab is gone
