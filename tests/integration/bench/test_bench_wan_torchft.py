"""bench wan's torchft row (geotrain.bench.wan_torchft): torchft's DiLoCo, unmodified, over emulated
links; its bytes are the ring all-reduce of the fp32 model (should_quantize sends fp32 on CPU), and
the Lighthouse the bench started is gone afterwards."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from geotrain.bench.wan import WanBenchConfig, WanBenchError, WanRow, bench_cluster, model_job
from geotrain.bench.wan_torchft import run_torchft_row, torchft_settings
from geotrain.cluster import load_cluster
from geotrain.data import world_tokens

torchft = pytest.importorskip("torchft")


def test_torchft_settings_follow_torchfts_rules():
    assert torchft_settings({"sync_every": 4, "fragments": 2})["delay"] == 0
    with pytest.raises(WanBenchError, match="fragments must divide sync_every"):
        torchft_settings({"sync_every": 5, "fragments": 4})
    with pytest.raises(WanBenchError, match="unknown option"):
        torchft_settings({"codec": "int8-block"})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_torchft_row_trains_reports_the_fp32_ring_bytes_and_stops_the_lighthouse(monkeypatch):
    import torchft._torchft as native

    started = []
    real = native.LighthouseServer

    def recording(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(native, "LighthouseServer", recording)
    config = WanBenchConfig(steps=5, eval_every=5, global_batch=8)
    row = WanRow("torchft DiLoCo", engine="torchft",
                 options=(("sync_every", 5), ("outer_lr", 1.0), ("outer_momentum", 0.0), ("should_quantize", True)))
    cluster = load_cluster(bench_cluster("wan-4x1"))
    result = run_torchft_row(row, cluster, np.array([[0, 2]]), config, world_tokens(0))
    params = int(model_job(8).params)
    # one sync, 2 replicas in different regions: a ring all-reduce of the fp32 model, 2 rounds of half each
    assert result.inter_region_bytes == 2 * 2 * (params * 4 / 2)
    assert result.eval_steps == [5] and result.replicas == 2
    assert 2.5 < result.val_losses[0] < 4.0  # trained (untrained: 5.1)
    # the sync's all-reduce crosses oregon-frankfurt (100 Mbit/s): 2 rounds of 1.63 MB, >= 0.26 s each
    assert result.step_time_s * 4 > 2 * 8 * params * 4 / 2 / 0.1e9
    address = started[0].address().rsplit("/", 1)[-1]
    host, port = address.rsplit(":", 1)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
