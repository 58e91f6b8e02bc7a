"""torchft's reconfigurable gloo groups under the emulating backend (geotrain.emulate.torchft_groups):
two real processes configure a torchft ProcessGroupGloo twice (two quorums) and all-reduce; the
results are gloo's, the emulated time and bytes are the ring's on the cluster's link."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from paths import ROOT

pytest.importorskip("torchft")
pytestmark = pytest.mark.slow  # real processes: seconds

WORKER = """
import json, sys
from datetime import timedelta
import torch, torch.distributed as dist
from torchft.process_group import ProcessGroupGloo
from geotrain.cluster import cluster_from_dict
from geotrain.emulate.network import EmulatedNetwork
from geotrain.emulate.torchft_groups import TorchftGroups

rank, port, device = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cluster = cluster_from_dict({"name": "t2", "regions": [{"name": "a", "devices": 1}, {"name": "b", "devices": 1}],
                             "links": [{"between": ["a", "b"], "gbps": 0.1, "ms": 50}]})
store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=30))
original = ProcessGroupGloo._create_pg
out = {"sums": [], "spans": []}
with TorchftGroups(EmulatedNetwork.from_cluster(cluster, time_scale=0.0), device) as emulated:
    pg = ProcessGroupGloo(timeout=timedelta(seconds=30))
    for quorum in range(2):            # torchft reconfigures at every quorum: a new group each time
        pg.configure(f"127.0.0.1:{port}/torchft/{quorum}/0", f"replica{rank}", rank, 2)
        t = torch.full((250_000,), float(rank + 1 + quorum))          # 1e6 bytes
        opts = dist.AllreduceOptions(); opts.reduceOp = dist.ReduceOp.SUM
        pg.allreduce([t], opts).wait()
        out["sums"].append(float(t[0]))
        out["spans"].append([s[2] - s[1] for s in pg.parent.spans if s[0] == "allreduce"])
    out["devices"] = [g.devices for g in emulated.groups]
    out["bytes"] = emulated.bytes_sent()
    out["inter_bytes"] = emulated.bytes_sent(cluster.region_of)
    out["type"] = type(pg.parent).__name__
out["restored"] = ProcessGroupGloo._create_pg is original
print(json.dumps(out))
"""


def test_torchft_groups_are_emulated_across_reconfiguration_with_ring_time_and_bytes(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    from geotrain.emulate.launch import free_port

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for attempt in range(3):  # the free port can be taken by a parallel test before the store binds it
        port = free_port()
        # rank 0 emulates device 1 and rank 1 device 0: quorum ranks are not devices
        procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(port), str(1 - rank)], cwd=tmp_path,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for rank in range(2)]
        done = [proc.communicate(timeout=90) for proc in procs]
        if not any("EADDRINUSE" in stderr for _, stderr in done):
            break
    outs = []
    for proc, (stdout, stderr) in zip(procs, done, strict=True):
        assert proc.returncode == 0, stderr[-2000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    ring_s = 2 * (0.050 + 8 * 0.5e6 / 0.1e9)  # n = 2: 2 rounds of b/2 over 100 Mbit/s, 50 ms
    for rank, out in enumerate(outs):
        assert out["sums"] == [3.0, 5.0]  # gloo's results, both quorums
        assert out["type"] == "TorchftEmulatedGroup"
        assert out["devices"] == [[1, 0], [1, 0]]  # quorum rank -> the device each member emulates
        assert [len(spans) for spans in out["spans"]] == [1, 1]
        assert out["spans"][0][0] == pytest.approx(ring_s, rel=1e-9)
        assert out["spans"][1][0] == pytest.approx(ring_s, rel=1e-9)
        assert out["bytes"] == out["inter_bytes"] == 2 * 1e6  # 2 rounds x 0.5 MB, per quorum
        assert out["restored"]
