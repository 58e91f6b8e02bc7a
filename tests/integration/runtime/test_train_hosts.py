"""Several hosts for `geotrain train`: ranks per host, the rendezvous checks, torchrun commands, and a
real two-host run over TCP between two network namespaces."""

from paths import ROOT
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cli.main import build_parser, main
from geotrain.cli.train_cmd import forwarded_arguments
from geotrain.cluster import parse_cluster_text
from geotrain.runtime import Layout
from geotrain.runtime.hosts import (NODE_ENV, HostsError, Rendezvous, host_layout, parse_endpoint, plan_rank,
                                    torchrun_commands)

SRC = str(ROOT / "src")
# hosts A (east: devices 0, 1) and B (west: devices 2, 3); A's GPUs listed in reverse
CLUSTER = """name: two-hosts
devices:
  - {name: e0, region: east, host: A, gpu_index: 1}
  - {name: e1, region: east, host: A, gpu_index: 0}
  - {name: w0, region: west, host: B}
  - {name: w1, region: west, host: B}
bandwidth_gbps: [[0, 10, 1, 1], [10, 0, 1, 1], [1, 1, 0, 10], [1, 1, 10, 0]]
latency_ms: [[0, 0.1, 20, 20], [0.1, 0, 20, 20], [20, 20, 0, 0.1], [20, 20, 0.1, 0]]
"""
PLAN = {"method": "manual", "stages": 2, "replicas": 2, "assignment": [[0, 2], [1, 3]]}
# rank s*R + r runs assignment[s][r]: rank 0 = e0 (A), 1 = w0 (B), 2 = e1 (A), 3 = w1 (B)


def two_hosts():
    return host_layout(parse_cluster_text(CLUSTER, "c.yaml"), Layout(PLAN["assignment"]))


def test_ranks_are_grouped_by_the_host_of_their_device_rank_zero_first():
    hosts = two_hosts()
    assert [(n.name, n.ranks, n.gpu_index) for n in hosts.nodes] == [("A", (0, 2), (1, 0)), ("B", (1, 3), (None, None))]
    assert hosts.node("A").cuda_visible_devices() == "1,0"  # cuda:LOCAL_RANK = the GPU of the i-th rank
    assert hosts.node("B").cuda_visible_devices() is None
    swapped = host_layout(parse_cluster_text(CLUSTER, "c.yaml"), Layout([[2, 0], [3, 1]]))
    assert [n.name for n in swapped.nodes] == ["B", "A"]  # the host of rank 0 hosts the rendezvous


def test_multi_host_errors_name_the_option_and_value():
    hosts = two_hosts()
    with pytest.raises(HostsError, match=r"--node: unknown node 'C': the plan's devices live on A, B"):
        hosts.node("C")
    no_host = parse_cluster_text(CLUSTER.replace(", host: B}", "}", 1), "c.yaml")
    with pytest.raises(HostsError, match=r"c.yaml: device 'w0' \(rank 1\) names no host \(1 of the plan's 4"):
        host_layout(no_host, Layout(PLAN["assignment"]), "c.yaml")
    with pytest.raises(HostsError, match=r"3 processes on node 'A' \(LOCAL_WORLD_SIZE\), but the plan puts 2 ranks"):
        plan_rank(hosts.node("A"), 0, 3)
    assert [plan_rank(hosts.node("B"), i, 2) for i in range(2)] == [1, 3]
    half_gpus = parse_cluster_text(CLUSTER.replace(", gpu_index: 0}", "}"), "c.yaml")
    with pytest.raises(HostsError, match="some of its devices give gpu_index"):
        host_layout(half_gpus, Layout(PLAN["assignment"])).node("A").cuda_visible_devices()


@settings(max_examples=60, deadline=None)
@given(host=st.sampled_from(["node-a", "10.0.0.1", "[fe80::1]", "h"]), port=st.integers(-5, 70000))
def test_rendezvous_endpoint_parses_or_fails_on_one_line(host, port):
    text = f"{host}:{port}"
    if 1 <= port <= 65535:
        assert parse_endpoint(text) == (host.strip("[]"), port)
    else:
        with pytest.raises(HostsError, match=r"^--rdzv: must be HOST:PORT"):
            parse_endpoint(text)
    for bad in (host, f":{port}", f"{host}:x"):
        with pytest.raises(HostsError):
            parse_endpoint(bad)


def test_torchrun_commands_give_each_host_its_node_rank_and_process_count():
    commands = torchrun_commands(two_hosts(), ("10.1.2.3", 29511), ["--plan", "p.json", "--steps", "3"])
    assert [name for name, _ in commands] == ["A", "B"]
    for node_rank, (name, command) in enumerate(commands):
        words = shlex.split(command)
        assert words[0] == f"{NODE_ENV}={name}"
        assert f"--node-rank={node_rank}" in words and "--nnodes=2" in words and "--nproc-per-node=2" in words
        assert "--master-addr=10.1.2.3" in words and "--master-port=29511" in words
        assert words[words.index("-m") + 1:] == ["geotrain", "train", "--plan", "p.json", "--steps", "3"]
    assert "CUDA_VISIBLE_DEVICES=1,0" in commands[0][1] and "CUDA_VISIBLE_DEVICES" not in commands[1][1]


def test_forwarded_arguments_reproduce_the_training_options():
    argv = ["train", "--plan", "p.json", "--cluster", "c.yaml", "--steps", "7", "--no-error-feedback", "--json",
            "--dp-codec", "topk:fraction=0.01", "--node", "A", "--rdzv", "x:1", "--print-torchrun"]
    args = build_parser().parse_args(argv)
    words = forwarded_arguments(args)
    assert "--node" not in words and "--rdzv" not in words and "--print-torchrun" not in words
    again = build_parser().parse_args(["train", *words])
    for key, value in vars(args).items():
        if key not in ("node", "rdzv", "print_torchrun", "handler"):
            assert getattr(again, key) == value, key


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "p.json").write_text(json.dumps(PLAN))
    return tmp_path


def test_cli_prints_one_torchrun_command_per_host(files, capsys):
    assert main(["train", "--plan", str(files / "p.json"), "--cluster", str(files / "c.yaml"), "--print-torchrun",
                 "--rdzv", "10.0.0.5:29400", "--json", "--steps", "2"]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert [(n["node"], n["ranks"]) for n in nodes] == [("A", [0, 2]), ("B", [1, 3])]
    assert "--master-addr=10.0.0.5" in nodes[1]["command"] and "--steps 2" in nodes[1]["command"]


@pytest.mark.parametrize("extra,message", [
    (["--node", "C", "--rdzv", "h:1"], "--node: unknown node 'C'"),
    (["--node", "A"], "--node: needs --rdzv HOST:PORT"),
    (["--rdzv", "h:1"], "--rdzv: needs --node NAME"),
    (["--node", "A", "--rdzv", "h"], "--rdzv: must be HOST:PORT"),
])
def test_cli_refuses_bad_host_options_on_one_line_with_exit_2(files, capsys, extra, message):
    code = main(["train", "--plan", str(files / "p.json"), "--cluster", str(files / "c.yaml"), "--run-dir", "none",
                 *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_host_whose_peer_never_comes_fails_on_one_line_in_bounded_time(files, capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    code = main(["train", "--plan", str(files / "p.json"), "--cluster", str(files / "c.yaml"), "--node", "A",
                 "--rdzv", f"127.0.0.1:{port}", "--comm-timeout", "2", "--run-dir", "none"])
    err = capsys.readouterr().err
    assert code == 2 and "--rdzv: node 'B' did not join 127.0.0.1:" in err and len(err.strip().splitlines()) == 1
    assert time.monotonic() - started < 60


def test_nodes_that_disagree_on_their_ranks_fail_at_the_rendezvous():
    hosts = two_hosts()
    moved = CLUSTER.replace("e1, region: east, host: A", "e1, region: east, host: B").replace(
        "w0, region: west, host: B", "w0, region: west, host: A")
    other = host_layout(parse_cluster_text(moved, "c2.yaml"), Layout(PLAN["assignment"]))  # A: 0, 1; B: 2, 3
    assert other.node("B").ranks != hosts.node("B").ranks
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    errors = []
    host_side = threading.Thread(target=lambda: _open_and_record(Rendezvous(hosts, "A", "127.0.0.1", port, 10.0), errors))
    host_side.start()
    time.sleep(0.5)
    with pytest.raises(HostsError, match=r"--node: node 'A' runs ranks \[0, 2\], but this node's plan and cluster put"):
        Rendezvous(other, "B", "127.0.0.1", port, 10.0).open_store()
    host_side.join(30)
    assert errors and "node 'B' runs ranks" in errors[0]


def _open_and_record(rendezvous, errors):
    try:
        rendezvous.open_store()
    except HostsError as exc:
        errors.append(str(exc))


def _netns_or_skip() -> None:
    from geotrain.netlab.build import check_can_build
    from geotrain.netlab.topology import NetLabError

    try:
        check_can_build()
    except NetLabError as exc:
        pytest.skip(str(exc))


def test_host_pair_carries_tcp_and_is_removed_with_its_processes_on_failure():
    from geotrain.netlab.hostpair import HostPair

    _netns_or_skip()
    with pytest.raises(RuntimeError, match="boom"):
        with HostPair() as pair:
            server = pair.run(0, [sys.executable, "-c", "import socket; s = socket.create_server(('', 29518)); "
                                                       "c, _ = s.accept(); c.sendall(c.recv(5))"])
            time.sleep(0.5)
            client = pair.run(1, [sys.executable, "-c", f"import socket; c = socket.create_connection(('{pair.addresses[0]}', "
                                                       f"29518), 10); c.sendall(b'hello'); print(c.recv(5).decode())"],
                              stdout=subprocess.PIPE)
            assert client.communicate(timeout=30)[0].decode().strip() == "hello"  # real TCP over the veth
            sleeper = pair.run(1, [sys.executable, "-c", "import time; time.sleep(600)"])
            namespaces = pair.namespaces
            raise RuntimeError("boom")
    assert server.poll() is not None and sleeper.poll() is not None
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in existing for name in namespaces)


def _train_argv(files: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "geotrain", "train", "--plan", str(files / "p.json"), "--cluster",
            str(files / "c.yaml"), "--steps", "3", "--time-scale", "0", "--json", "--run-dir", "none", *extra]


@pytest.mark.slow
def test_two_hosts_in_network_namespaces_train_like_one_host(files):
    """Two namespaces joined by a veth pair, one `geotrain train --node` each over real TCP (gloo on the
    veth): the run completes, replicas stay bit-identical, losses equal the one-host run's."""
    from geotrain.netlab.hostpair import HostPair

    _netns_or_skip()
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.perf_counter()
    with HostPair() as pair:
        rdzv = f"{pair.addresses[0]}:29517"
        runs = [pair.run(i, _train_argv(files, "--node", node, "--rdzv", rdzv),
                         {**env, "GLOO_SOCKET_IFNAME": pair.ifnames[i]}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for i, node in enumerate(("A", "B"))]
        outputs = [run.communicate(timeout=240) for run in runs]
        namespaces = pair.namespaces
    two_host_s = time.perf_counter() - started
    assert [run.returncode for run in runs] == [0, 0], [err.decode()[-600:] for _, err in outputs]
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in existing for name in namespaces)
    a, b = (json.loads(out) for out, _ in outputs)
    assert b["node"] == "B" and b["ranks"] == [1, 3]
    assert a["summary"]["replicas_in_sync"] is True
    started = time.perf_counter()
    one = subprocess.run(_train_argv(files), env=env, capture_output=True, timeout=240)
    one_host_s = time.perf_counter() - started
    assert one.returncode == 0, one.stderr.decode()[-600:]
    assert a["losses"] == json.loads(one.stdout)["losses"]  # same seed, same plan: bit for bit
    print(f"\nwall s: two hosts {two_host_s:.1f} (launcher {a['wall_s']:.1f}), one host {one_host_s:.1f}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_killed_host_ends_the_other_hosts_run_in_bounded_time_with_no_orphans(files):
    """Host B's launcher is SIGKILLed mid-run: its workers die with it, host A's workers notice the lost
    ranks through the heartbeat and A's launcher exits 2 naming a rank; nothing of either is left."""
    from proctree import alive, comm, descendants

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = [sys.executable, "-m", "geotrain", "train", "--plan", str(files / "p.json"), "--cluster",
            str(files / "c.yaml"), "--steps", "500", "--time-scale", "0", "--heartbeat-timeout", "3",
            "--rdzv", f"127.0.0.1:{port}", "--run-dir", "none", "--node"]
    a, b = (subprocess.Popen(argv + [node], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for node in ("A", "B"))
    try:
        deadline = time.monotonic() + 150
        while not {comm(pid) for pid in descendants(b.pid)} >= {"geotrain-r1", "geotrain-r3"}:
            assert a.poll() is None and b.poll() is None, (a.communicate(), b.communicate())
            assert time.monotonic() < deadline, "host B's workers did not start within 150 s"
            time.sleep(0.2)
        time.sleep(2.0)  # mid-run
        family = descendants(a.pid) | descendants(b.pid)
        b.kill()
        _, err = a.communicate(timeout=120)
        b.wait(10)
    finally:
        for process in (a, b):
            if process.poll() is None:
                process.kill()
    assert a.returncode == 2, err[-800:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("geotrain: error:") and ("rank 1" in last or "rank 3" in last), last
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in family if alive(pid)]
