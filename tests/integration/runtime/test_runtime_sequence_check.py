"""`geotrain train --seq-len 100000` fails in one line before any process starts (it ran > 120 s without
a word): the activations a TinyGPT preset would keep at that length are estimated and compared with
the memory the ranks share."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from geotrain.cluster import make_network
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.sequence_check import (SequenceTooLongError, activation_bytes_per_rank, available_memory_bytes,
                                             check_sequence_fits)

from runtime_2x2 import CLUSTER_YAML, PLAN

CLUSTER = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0)


def _config(**changes) -> RuntimeConfig:
    return RuntimeConfig.of(CLUSTER, np.array(PLAN["assignment"]), **changes)


def test_the_estimate_is_68_bytes_per_token_hidden_unit_layer_and_in_flight_microbatch():
    config = _config(seq_len=1000, schedule="gpipe")
    b, layers_per_rank = config.microbatch_size, -(-(config.model.gpt.n_layer + 2) // 2)
    expected = 68 * 1000 * b * config.model.gpt.d_model * layers_per_rank * config.schedule.microbatches + 4 * 1000 * b * 256
    assert activation_bytes_per_rank(config) == pytest.approx(expected)
    one_f_one_b = _config(seq_len=1000, schedule="1f1b")
    assert activation_bytes_per_rank(one_f_one_b) == pytest.approx(expected - 68 * 1000 * b * 128 * 3 * 2)


def test_a_sequence_beyond_the_memory_is_refused_and_one_within_passes():
    config = _config(seq_len=100_000)
    need = activation_bytes_per_rank(config) * config.world_size
    with pytest.raises(SequenceTooLongError, match=r"^--seq-len 100000: model 'tiny' \(d_model 128\) would keep about "
                                                    r"\d+\.\d GB of activations, more than the memory available"):
        check_sequence_fits(config, available_bytes=int(need) - 1)
    check_sequence_fits(config, available_bytes=int(need) + 1)
    check_sequence_fits(_config(), available_bytes=4 * 10**9)  # the default length fits a small machine


@pytest.mark.timeout(120)
def test_train_with_seq_len_100000_fails_fast_in_one_line(tmp_path):
    config = _config(seq_len=100_000)
    if activation_bytes_per_rank(config) * config.world_size < (available_memory_bytes() or 0):
        pytest.skip("this machine has the memory for 4 ranks at 100000 tokens")
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "geotrain", "train", "--run-dir", "none", "--cluster", str(tmp_path / "cluster.yaml"),
                           "--plan", str(tmp_path / "plan.json"), "--steps", "2", "--time-scale", "0",
                           "--seq-len", "100000"], capture_output=True, text=True, timeout=100)
    assert done.returncode == 2
    assert done.stderr.startswith("geotrain: error: --seq-len 100000: model 'tiny' (d_model 128) would keep about ")
    assert len(done.stderr.splitlines()) == 1
    assert time.monotonic() - started < 60
