"""Emulated GPU speed: a rank's emulated compute is its measured compute x (fastest GPU / its GPU)."""

from __future__ import annotations

import json

import pytest

from geotrain.cluster import load_cluster
from geotrain.emulate import install
from geotrain.emulate.clock import RankClock
from geotrain.emulate.network import EmulationError
from geotrain.runtime import RuntimeConfig
from geotrain.runtime.config import RuntimeConfigError
from geotrain.sync.base import ComputeTimer
from paths import ROOT

MIXED = ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml"  # A100, V100, T4 x2


def test_clock_counts_compute_scale_times_the_real_compute_and_links_as_given():
    wall = [10.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        wall[0] += seconds
    clock = RankClock(1.0, wall=lambda: wall[0], sleep=sleep, compute_scale=3.0)
    clock.start_loop()  # the loop's compute (set-up before it counts at this machine's speed: startup rule tests)
    wall[0] += 0.5  # half a second of real compute on a device 3x slower: 1.5 emulated seconds
    assert clock.now() == pytest.approx(1.5)
    held = clock.hold()
    assert held[0] == pytest.approx(1.5)
    clock.finish(held, 2.5)  # the links end the operation at 2.5: one emulated second of link time slept
    assert slept == [pytest.approx(1.0)] and clock.now() == pytest.approx(2.5)
    wall[0] += 0.1
    assert clock.now() == pytest.approx(2.8)
    with pytest.raises(ValueError, match="compute_scale"):
        RankClock(1.0, compute_scale=0.0)


def test_compute_timer_scales_what_it_measures():
    plain, slow = ComputeTimer(), ComputeTimer(scale=4.0)
    with plain, slow:
        sum(range(20000))
    assert slow.seconds == pytest.approx(4.0 * plain.seconds, rel=0.5)  # same block, nested: near-equal spans
    assert slow.seconds > 2.0 * plain.seconds


def test_config_gives_every_device_the_fastest_gpus_peak_over_its_own():
    config = RuntimeConfig.of(cluster=load_cluster(MIXED), assignment=[[0, 4]], emulate_gpu_speed=True)
    assert config.compute_scale() == pytest.approx((1.0, 1.0, 312 / 125, 312 / 125, 312 / 65, 312 / 65))
    assert RuntimeConfig.of(cluster=load_cluster(MIXED), assignment=[[0, 4]]).compute_scale() is None
    with pytest.raises(RuntimeConfigError, match="time_scale 0.0 runs without emulation"):
        RuntimeConfig.of(cluster=load_cluster(MIXED), assignment=[[0, 4]], emulate_gpu_speed=True, time_scale=0.0)
    with pytest.raises(RuntimeConfigError, match="emulate_gpu_speed must be true or false"):
        RuntimeConfig.of(cluster=load_cluster(MIXED), assignment=[[0, 4]], emulate_gpu_speed="yes")


def test_install_refuses_a_compute_scale_per_device_of_the_wrong_shape_or_value():
    cluster = load_cluster(MIXED)
    for bad in ([1.0] * 5, [1.0] * 5 + [0.0], [1.0] * 5 + [float("nan")], [1.0] * 5 + [True]):
        with pytest.raises(EmulationError, match="compute_scale must be 6 finite factors > 0"):
            install(cluster, [0, 4], compute_scale=bad)


def test_train_flag_reaches_the_config(tmp_path):
    from geotrain.cli.main import build_parser
    from geotrain.cli.train_cmd import config_from_args

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"stages": 1, "replicas": 2, "assignment": [[0, 4]]}))
    args = build_parser().parse_args(["train", "--cluster", str(MIXED), "--plan", str(plan), "--emulate-gpu-speed"])
    assert config_from_args(args).emulation.emulate_gpu_speed is True
    args = build_parser().parse_args(["train", "--cluster", str(MIXED), "--plan", str(plan)])
    assert config_from_args(args).emulation.emulate_gpu_speed is False


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_t4_replica_computes_about_five_times_longer_than_measured():
    from geotrain.runtime import launch

    def run(**options):
        config = RuntimeConfig.of(cluster=load_cluster(MIXED), assignment=[[0, 4]], steps=3, batch_size=4,
                               microbatches=1, time_scale=0.01, heartbeat_timeout_s=20.0, **options)
        return min(row.compute_s for row in launch(config).report.rows[1:])

    measured, emulated = run(), run(emulate_gpu_speed=True)
    # the slowest slot's compute per step (steps after the first, the least loaded of them): as measured vs
    # the T4's x 312/65 = 4.8 (one replica each, same work). Measured on a quiet machine 2.7-2.9x (not all
    # of a step's compute is scaled); the two runs' real compute differs with the machine's load (a 2x
    # threshold on the means failed once under load at 1.77x), so the factor asked is loose: without the
    # emulation it is 1
    assert emulated > 1.5 * measured, (emulated, measured)


_BUSY_SCRIPT = """
import json, os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
started = time.perf_counter()
sum(i * i for i in range(300_000))  # the same compute on every rank
busy = time.perf_counter() - started
dist.barrier()
with open(os.path.join(sys.argv[1], f"busy{dist.get_rank()}.json"), "w") as handle:
    json.dump(busy, handle)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("flag", [True, False])
def test_emulate_flag_counts_each_ranks_compute_at_its_gpus_speed(tmp_path, flag):
    import subprocess
    import sys

    from geotrain.emulate.report import barrier_intervals_s

    script = tmp_path / "busy.py"
    script.write_text(_BUSY_SCRIPT)
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "geotrain", "emulate", "--cluster", str(MIXED), "--devices", "0,4",
               "--time-scale", "0", "--report", str(report), *(["--emulate-gpu-speed"] if flag else []),
               "--", str(script), str(tmp_path)]
    subprocess.run(command, check=True, timeout=180)
    result = json.loads(report.read_text())
    scales = [rank["compute_scale"] for rank in result["ranks"]]
    assert scales == ([1.0, pytest.approx(312 / 65)] if flag else [1.0, 1.0])  # an A100 and a T4
    if flag:
        # the emulated clock of the T4 rank counts 312/65 x its real seconds between the two barriers, and the
        # second barrier ends when its last member arrives: an identity of the clock, not a timing
        busy = json.loads((tmp_path / "busy1.json").read_text())
        assert barrier_intervals_s(result)[-1] >= 312 / 65 * busy * (1 - 1e-9)


_SLEEP_SCRIPT = """
import json, os, sys, time
import torch.distributed as dist
from geotrain.emulate import emulated_clock
dist.init_process_group("gloo")
dist.barrier()  # the loop starts: compute counts at the device's speed from here (emulate/clock.py)
clock = emulated_clock()
before = clock()
time.sleep(0.5)  # no compute: half a second of wall time, next to no CPU time
with open(os.path.join(sys.argv[1], f"slept{dist.get_rank()}.json"), "w") as handle:
    json.dump(clock() - before, handle)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("compute_clock", ["wall", "cpu"])
def test_emulate_compute_clock_counts_wall_or_cpu_seconds(tmp_path, compute_clock):
    import subprocess
    import sys

    script = tmp_path / "sleep.py"
    script.write_text(_SLEEP_SCRIPT)
    subprocess.run([sys.executable, "-m", "geotrain", "emulate", "--cluster", str(MIXED), "--devices", "0,4",
                    "--time-scale", "0", "--emulate-gpu-speed", "--compute-clock", compute_clock, "--",
                    str(script), str(tmp_path)], check=True, timeout=180)
    a100, t4 = (json.loads((tmp_path / f"slept{r}.json").read_text()) for r in (0, 1))
    if compute_clock == "wall":  # the sleep counts, x the T4's factor on the T4
        assert a100 >= 0.5 and t4 >= 312 / 65 * 0.5
    else:  # a sleeping rank spends no CPU seconds: its emulated clock hardly moves
        assert a100 < 0.25 and t4 < 0.25


_SET_UP_SCRIPT = """
import json, os, sys, time
import torch
import torch.distributed as dist
from geotrain.emulate import emulated_clock, host_work
dist.init_process_group("gloo")
clock = emulated_clock()
started = time.process_time()
while time.process_time() - started < 0.8:  # about a CPU second of set-up before the loop
    sum(i * i for i in range(10_000))
with host_work():  # set-up that runs a collective of its own: the barrier does not start the loop
    dist.barrier()
    while time.process_time() - started < 1.0:
        sum(i * i for i in range(10_000))
set_up = time.process_time() - started
before_loop = clock()
t = torch.ones(1000)
for _ in range(3):  # the loop
    dist.all_reduce(t)
a = clock()
started = time.process_time()
sum(i * i for i in range(1_000_000))
busy = time.process_time() - started
b = clock()
dist.barrier()
with open(os.path.join(sys.argv[1], f"set_up{dist.get_rank()}.json"), "w") as handle:
    json.dump({"set_up": set_up, "before_loop": before_loop, "busy": busy, "busy_emulated": b - a}, handle)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_emulate_counts_set_up_before_the_loop_at_this_machines_speed_and_the_loop_at_the_gpus(tmp_path):
    import subprocess
    import sys

    from two_gpus import TWO_GPUS_YAML

    (tmp_path / "cluster.yaml").write_text(TWO_GPUS_YAML)
    script = tmp_path / "set_up.py"
    script.write_text(_SET_UP_SCRIPT)
    subprocess.run([sys.executable, "-m", "geotrain", "emulate", "--cluster", str(tmp_path / "cluster.yaml"),
                    "--devices", "0,1", "--time-scale", "0", "--emulate-gpu-speed", "--compute-clock", "cpu", "--",
                    str(script), str(tmp_path)], check=True, timeout=180)
    a100, t4 = (json.loads((tmp_path / f"set_up{r}.json").read_text()) for r in (0, 1))
    # CPU seconds since init_process_group, x 1 on both: the T4 rank's set-up is not 4.8 x (the old rule: 4.80 s
    # emulated for 1.00 s of CPU); the clock also counts the few ms between init and the burn and the barrier's
    # link time, not the CPU gloo's threads spend while it blocks (a few ms at most)
    for rank in (a100, t4):
        assert rank["set_up"] - 0.05 <= rank["before_loop"] < rank["set_up"] + 0.3, rank
    # in the loop the T4 computes at 312/65 of this machine's time, the A100 at 1 (clock identities: the clock
    # reads CPU seconds around the measured block)
    assert t4["busy_emulated"] >= 312 / 65 * t4["busy"] * (1 - 1e-9)
    assert a100["busy"] <= a100["busy_emulated"] < 2 * a100["busy"]
