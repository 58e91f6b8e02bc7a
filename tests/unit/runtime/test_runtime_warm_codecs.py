"""A worker loads its codecs' compiled kernels before the rendezvous (runtime.worker.warm_codecs): numba's loading
holds the GIL, and under the watchdog it silenced a rank's heartbeat past a short --heartbeat-timeout at start-up
(bench chaos's asynchronous restart rows: 3 spurious "lost rank" restarts in one 2-kill run at load 15)."""

from __future__ import annotations

from geotrain.cluster import load_cluster
from geotrain.codecs.base import Codec
from geotrain.runtime import RuntimeConfig
from geotrain.runtime.worker import warm_codecs


def test_every_codec_of_the_run_is_warmed_once(monkeypatch):
    warmed = []
    monkeypatch.setattr(Codec, "warm_up", lambda self: warmed.append(self.name))
    cluster = load_cluster("seed-datacenter")
    warm_codecs(RuntimeConfig.of(cluster, [[0, 1]], steps=3, dp_codec="int8-block"))
    assert set(warmed) == {"int8-block", "none"}  # the gradients' codec and the (unused) activations' none
    warmed.clear()
    warm_codecs(RuntimeConfig.of(cluster, [[0], [1]], steps=3, dp_codec="fp16", pp_codec="fp16"))
    assert set(warmed) == {"fp16"}
