"""`geotrain.diloco.DiLoCo` around a user's loop: real gloo processes, the example script under torchrun
and `geotrain emulate`, replicas equal after the final sync, bytes sent = the codec's declared bytes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from geotrain.codecs import get_codec
from geotrain.comm import run_workers
from geotrain.diloco import DiLoCo
from geotrain.sync import SyncError
from geotrain.sync.streaming import fragment_due
from paths import ROOT



def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 1))


def _user_loop(rank: int, world: int, codec: str, fragments: int, delay: int, steps: int, landing: str = "mix") -> dict:
    model = _model()
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(7 + rank)
    losses = []
    with DiLoCo(model, inner, sync_every=4, fragments=fragments, delay=delay, mix=0.5 if landing == "mix" else 0.0,
                landing=landing, codec=codec, outer_lr=0.7, outer_momentum=0.9) as diloco:
        for _ in range(steps):
            x = torch.randn(16, 8, generator=data)
            loss = torch.nn.functional.mse_loss(model(x), x[:, :1] - 0.5 * x[:, 1:2])
            inner.zero_grad()
            loss.backward()
            inner.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)  # the loop's own collective between posted exchanges
            losses.append(float(mean) / world)
        in_flight = diloco.sync.in_flight
    numels = [sum(p.numel() for p in f.outer.params) for f in diloco.sync.fragments]
    return {"params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]), "bytes": diloco.bytes_sent,
            "declared": diloco.declared_bytes, "numels": numels, "steps": diloco.inner_steps,
            "in_flight_before_exit": in_flight, "losses": losses}


@pytest.mark.parametrize("codec,fragments,delay,landing", [
    ("int8-block", 1, 0, "mix"), ("int4-block", 2, 1, "mix"), ("fp4-block", 4, 2, "eager"),
    ("topk-lowbit:fraction=0.1,chunk_size=256", 2, 1, "mix")])
def test_user_loop_replicas_agree_and_bytes_sent_are_the_codecs_declared_bytes(codec, fragments, delay, landing):
    steps = 10
    results = run_workers(_user_loop, 2, (codec, fragments, delay, steps, landing), timeout_s=180)
    assert torch.equal(results[0]["params"], results[1]["params"])
    for result in results:
        assert result["steps"] == steps
        # every fragment synced when due (steps 0..9, H=4) and once more when the context closed
        syncs = [sum(fragment_due(s, p, fragments, 4) for s in range(steps)) + 1 for p in range(fragments)]
        spec_name, _, params = codec.partition(":")
        kwargs = dict(item.split("=") for item in params.split(",")) if params else {}
        kwargs = {k: float(v) if "." in v else int(v) for k, v in kwargs.items()}
        codec_ = get_codec(spec_name, **kwargs)
        expected = sum(count * codec_.wire_nbytes((n,)) for count, n in zip(syncs, result["numels"], strict=True))
        assert result["bytes"] == result["declared"] == expected
    assert results[0]["losses"] == results[1]["losses"]
    # the syncs started in the last `delay` steps were still travelling when the loop ended
    late = sum(fragment_due(s, p, fragments, 4) for p in range(fragments) for s in range(steps - delay, steps))
    assert results[0]["in_flight_before_exit"] == (late if delay else 0)


def _blocking_loop(rank: int, world: int) -> torch.Tensor:
    model = _model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    with DiLoCo(model, inner, sync_every=2, codec="none", outer_lr=1.0, outer_momentum=0.0):
        for step in range(2):
            inner.zero_grad()
            model(torch.full((4, 8), float(rank + step))).sum().backward()
            inner.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _two_local_sgd_replicas() -> torch.Tensor:
    finals = []
    for rank in range(2):
        model = _model()
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            inner.zero_grad()
            model(torch.full((4, 8), float(rank + step))).sum().backward()
            inner.step()
        finals.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return (finals[0] + finals[1]) / 2


def test_outer_lr_one_without_momentum_averages_the_replicas():
    """lr 1, momentum 0, codec none: the outer step is model averaging (checked against an in-process mean)."""
    results = run_workers(_blocking_loop, 2, (), timeout_s=120)
    assert torch.equal(results[0], results[1])
    assert torch.allclose(results[0], _two_local_sgd_replicas(), rtol=0, atol=1e-6)


def _refused(rank: int, world: int) -> list[str]:
    model = _model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    messages = []
    for kwargs in ({"sync_every": 0}, {"sync_every": 4, "delay": 4}, {"sync_every": 4, "fragments": 9},
                   {"sync_every": 4, "codec": "int5"}):
        try:
            DiLoCo(model, inner, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the test reports the type and message
            messages.append(f"{type(exc).__name__}: {exc}")
    return messages


def test_bad_settings_are_refused_naming_the_value():
    messages = run_workers(_refused, 1, (), timeout_s=60)[0]
    assert "SyncError: DiLoCo: sync_every must be an integer >= 1, got 0" in messages[0]
    assert "delay must be an integer in 0..3" in messages[1]
    assert "fragments must be at most sync_every (4) so their offsets differ, got 9" in messages[2]
    assert "unknown codec 'int5'" in messages[3]
    with pytest.raises(SyncError, match="init_process_group"):
        DiLoCo(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), sync_every=2)


FINAL = re.compile(r"rank (\d) final (\S+) bytes (\d+) declared (\d+)")
LOSS = re.compile(r"step (\d+) loss (\S+)")


def _run(command: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_example_runs_unmodified_under_torchrun_and_emulate_with_equal_replicas_and_results():
    args = ["examples/diloco_train.py", "--steps", "10", "--hidden", "32"]
    plain = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args])
    emulated = _run([sys.executable, "-m", "geotrain", "emulate", "--cluster", "seed-geo", "--devices", "0,8",
                     "--time-scale", "0", "--timeout", "250", "--", *args])
    for output in (plain, emulated):
        finals = FINAL.findall(output)
        assert len(finals) == 2 and finals[0][1:] == finals[1][1:]  # same parameters and bytes on both ranks
        assert finals[0][2] == finals[0][3] and int(finals[0][2]) > 0  # bytes sent == declared
    assert FINAL.findall(plain) == FINAL.findall(emulated) or sorted(FINAL.findall(plain)) == sorted(
        FINAL.findall(emulated))
    assert LOSS.findall(plain) == LOSS.findall(emulated) and len(LOSS.findall(plain)) == 10
    # --sync-moments: AdamW's moments travel with the outer gradients; replicas agree, bytes = declared
    moments = _run([sys.executable, "-m", "geotrain", "emulate", "--cluster", "seed-geo", "--devices", "0,8",
                    "--time-scale", "0", "--timeout", "250", "--", *args, "--sync-moments"])
    finals = FINAL.findall(moments)
    assert len(finals) == 2 and finals[0][1:] == finals[1][1:] and finals[0][2] == finals[0][3]
    assert int(finals[0][2]) > int(FINAL.findall(plain)[0][2])
    assert LOSS.findall(moments) != LOSS.findall(plain)


def _regions_loop(rank: int, world: int, options: dict) -> dict:
    model = _model()
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(50 + rank)
    snapshots = []
    with DiLoCo(model, inner, sync_every=3, fragments=1, codec="int8-block", regions=[[0, 1], [2, 3]],
                outer_lr=0.7, outer_momentum=0.9, **options) as diloco:
        for _ in range(4):
            x = torch.randn(8, 8, generator=data)
            inner.zero_grad()
            torch.nn.functional.mse_loss(model(x), x[:, :1]).backward()
            inner.step()
            snapshots.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return {"snapshots": snapshots, "final": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
            "region_bytes": diloco.region_bytes, "bytes": diloco.bytes_sent, "declared": diloco.declared_bytes,
            "transport_bytes": diloco.transport.nbytes}


@pytest.mark.parametrize("options", [{}, {"delay": 1, "sync_moments": True}], ids=["blocking", "delay-1-moments"])
def test_regions_average_every_step_inside_a_site_and_sync_between_sites(options):
    """Also with the hierarchical exchange posted (delay 1: the sync after step 2 lands after step 3) carrying the
    moments (outer gradients, first and second moments: three hierarchical exchanges)."""
    results = run_workers(_regions_loop, 4, (options,), timeout_s=240)
    for a, b in ((0, 1), (2, 3)):  # members of a site take identical steps (full-precision gradient mean)
        assert all(torch.equal(x, y) for x, y in zip(results[a]["snapshots"], results[b]["snapshots"]))
    assert not torch.equal(results[0]["snapshots"][1], results[2]["snapshots"][1])  # sites differ between syncs
    assert all(torch.equal(r["final"], results[0]["final"]) for r in results)  # all agree after the final sync
    n = results[0]["final"].numel()
    assert results[0]["region_bytes"] == 4 * 4 * n  # fp32 all-reduce of the gradients, 4 inner steps
    # the outer syncs (steps 2 and the exit) are what the transport saw besides the regions' means
    assert results[0]["declared"] is None and results[0]["bytes"] > 0
    assert all(r["transport_bytes"] == r["region_bytes"] + r["bytes"] for r in results)
