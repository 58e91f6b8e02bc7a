"""torchrun edge cases: a worker whose peers never come ends in one line naming what is missing (not a
DistStoreError traceback), and --print-torchrun on a cluster without hosts prints one host's command."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from runtime_2x2 import CLUSTER_YAML, PLAN


@pytest.fixture
def files(tmp_path) -> list[str]:
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    return ["--cluster", str(tmp_path / "cluster.yaml"), "--plan", str(tmp_path / "plan.json")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(180)
def test_rank0_under_torchrun_without_peers_says_who_is_missing_in_one_line(files):
    port = _free_port()
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "t", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    done = subprocess.run([sys.executable, "-m", "geotrain", "train", "--run-dir", "none", *files, "--steps", "2", "--time-scale", "0",
                           "--comm-timeout", "3"], env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"geotrain: error: rendezvous at 127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT): only 1 of 4 workers joined "
        f"within 3 s (--comm-timeout); 3 missing: start every host's command (see --print-torchrun), each with "
        f"--nproc-per-node its ranks")


def test_print_torchrun_on_a_one_host_cluster_prints_one_command(files, capsys):
    from geotrain.cli.main import main

    assert main(["train", *files, "--steps", "2", "--print-torchrun", "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert [(n["node"], n["ranks"]) for n in nodes] == [("localhost", [0, 1, 2, 3])]
    assert nodes[0]["command"].startswith("GEOTRAIN_NODE=localhost torchrun --nnodes=1 --node-rank=0 "
                                          "--nproc-per-node=4 --master-addr=localhost --master-port=29500 "
                                          "-m geotrain train --cluster ")
