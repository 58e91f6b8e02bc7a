"""Conformance: every collective and ReduceOp gives, through the emulating backend, what plain gloo gives.

One launch per world size (2 and 3 ranks, time scale 0): each rank runs `suite` twice, on the emulated
default group and on a plain gloo group over the same ranks (torch's own `new_group`, the one `install`
wrapped), and saves both outcomes: the output tensors, or the refusal (exception type and message).
The test compares them bit for bit. This file is also the script the ranks run (`__main__` below).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from geotrain.cluster import cluster_from_dict
from geotrain.emulate.launch import LaunchConfig, launch
from paths import ROOT

Outcome = list[Any] | tuple[str, str]  # the tensors / objects an op produced, or ("error", "Type: message")
REDUCE_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR")
N = 6  # elements per rank in most cases (divisible by 2 and 3)


def inputs(rank: int, case: str, dtype: torch.dtype = torch.float32, numel: int = N) -> torch.Tensor:
    """The same pseudo-random input on every run: seeded by rank and case (floats near 1 for PRODUCT)."""
    gen = torch.Generator().manual_seed(1009 * rank + sum(map(ord, case)))
    if dtype.is_floating_point:
        return (1 + 0.1 * torch.randn(numel, generator=gen, dtype=torch.float64)).to(dtype)
    low = 0 if dtype == torch.uint8 else -1000
    return torch.randint(low, 100 if low == 0 else 1000, (numel,), generator=gen, dtype=dtype)


def _wait(work: Any, async_op: bool) -> None:
    if async_op:
        assert work is not None
        work.wait()


def suite(group: Any, rank: int, n: int) -> dict[str, Outcome]:
    """Run every case on `group`; each case's outcome on this rank."""
    out: dict[str, Outcome] = {}

    def case(name: str, fn: Callable[[], list[Any]]) -> None:
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001 (the refusal is the outcome compared)
            out[name] = ("error", f"{type(exc).__name__}: {exc}")

    def all_reduce(name: str, op: Any, dtype: torch.dtype, async_op: bool = False) -> list[Any]:
        t = inputs(rank, name, dtype)
        work = dist.all_reduce(t, op=op, group=group, async_op=async_op)
        _wait(work, async_op)
        return [t]

    for op in REDUCE_OPS:
        for dtype in (torch.float32, torch.int64):
            name = f"all_reduce/{op}/{dtype}"
            case(name, lambda name=name, op=op, dtype=dtype: all_reduce(name, getattr(dist.ReduceOp, op), dtype))
    for dtype in (torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.uint8):
        case(f"all_reduce/SUM/{dtype}", lambda dtype=dtype: all_reduce(f"s{dtype}", dist.ReduceOp.SUM, dtype))
    if hasattr(dist, "_make_nccl_premul_sum"):
        case("all_reduce/PREMUL_SUM", lambda: all_reduce("pre", dist._make_nccl_premul_sum(0.5), torch.float32))
    case("all_reduce/async", lambda: all_reduce("async", dist.ReduceOp.SUM, torch.float32, async_op=True))

    def future_value() -> list[Any]:
        t = inputs(rank, "fut")
        return list(dist.all_reduce(t, group=group, async_op=True).get_future().wait()) + [t]
    case("all_reduce/future", future_value)

    def broadcast(src: int, async_op: bool) -> list[Any]:
        t = inputs(rank, "bc")
        _wait(dist.broadcast(t, src, group=group, async_op=async_op), async_op)
        return [t]
    for src in (0, n - 1):
        case(f"broadcast/src{src}", lambda src=src: broadcast(src, False))
    case("broadcast/async", lambda: broadcast(1, True))

    def reduce(dst: int, op: str, async_op: bool = False) -> list[Any]:
        t = inputs(rank, f"red{op}")
        _wait(dist.reduce(t, dst, op=getattr(dist.ReduceOp, op), group=group, async_op=async_op), async_op)
        return [t] if rank == dst else []  # gloo leaves a non-root's buffer unspecified
    for dst, op in ((0, "SUM"), (n - 1, "MAX"), (1, "PRODUCT"), (0, "AVG")):
        case(f"reduce/{op}/dst{dst}", lambda dst=dst, op=op: reduce(dst, op))
    case("reduce/async", lambda: reduce(1, "MIN", True))

    def all_gather(async_op: bool) -> list[Any]:
        outs = [torch.empty(N) for _ in range(n)]
        _wait(dist.all_gather(outs, inputs(rank, "ag"), group=group, async_op=async_op), async_op)
        return outs
    case("all_gather", lambda: all_gather(False))
    case("all_gather/async", lambda: all_gather(True))

    def all_gather_tensor(shape: tuple[int, ...], base: bool = False, async_op: bool = False) -> list[Any]:
        out = torch.empty(shape)
        if base:
            work = dist._all_gather_base(out, inputs(rank, "agb"), group=group, async_op=async_op)
        else:
            work = dist.all_gather_into_tensor(out, inputs(rank, "agt"), group=group, async_op=async_op)
        _wait(work, async_op)
        return [out]
    case("all_gather_into_tensor/concat", lambda: all_gather_tensor((n * N,)))
    case("all_gather_into_tensor/stack", lambda: all_gather_tensor((n, N)))
    case("all_gather_into_tensor/async", lambda: all_gather_tensor((n * N,), async_op=True))
    case("_all_gather_base", lambda: all_gather_tensor((n * N,), base=True))

    def all_gather_coalesced() -> list[Any]:
        outs = [[torch.empty(N), torch.empty(2, 3)] for _ in range(n)]
        dist.all_gather_coalesced(outs, [inputs(rank, "agc"), inputs(rank, "agd").view(2, 3)], group=group)
        return [t for ts in outs for t in ts]
    if hasattr(dist, "all_gather_coalesced"):
        case("all_gather_coalesced", all_gather_coalesced)

    def reduce_scatter(op: str, form: str, async_op: bool = False) -> list[Any]:
        red = getattr(dist.ReduceOp, op)
        src = inputs(rank, f"rs{op}{form}", numel=n * N)
        out = torch.empty(N)
        if form == "list":
            work = dist.reduce_scatter(out, list(src.chunk(n)), op=red, group=group, async_op=async_op)
        elif form == "tensor":
            work = dist.reduce_scatter_tensor(out, src, op=red, group=group, async_op=async_op)
        else:
            work = dist._reduce_scatter_base(out, src, op=red, group=group, async_op=async_op)
        _wait(work, async_op)
        return [out]
    for form in ("list", "tensor", "base"):
        for op in ("SUM", "MAX", "AVG"):
            case(f"reduce_scatter/{form}/{op}", lambda form=form, op=op: reduce_scatter(op, form))
        case(f"reduce_scatter/{form}/async", lambda form=form: reduce_scatter("SUM", form, True))

    uneven_in = [(rank + j) % 3 + 1 for j in range(n)]  # what this rank sends to j: 1-3 rows
    uneven_out = [(j + rank) % 3 + 1 for j in range(n)]  # what j sends this rank

    def all_to_all_single(even: bool, async_op: bool = False) -> list[Any]:
        rows_in, rows_out = ([2] * n, [2] * n) if even else (uneven_in, uneven_out)
        src = inputs(rank, "a2as", numel=2 * sum(rows_in)).view(-1, 2)
        out = torch.empty(sum(rows_out), 2)
        splits = (None, None) if even else (rows_out, rows_in)
        _wait(dist.all_to_all_single(out, src, *splits, group=group, async_op=async_op), async_op)
        return [out]
    case("all_to_all_single/even", lambda: all_to_all_single(True))
    case("all_to_all_single/uneven", lambda: all_to_all_single(False))
    case("all_to_all_single/async", lambda: all_to_all_single(False, True))

    def all_to_all(even: bool) -> list[Any]:
        rows_in, rows_out = ([2] * n, [2] * n) if even else (uneven_in, uneven_out)
        src = [inputs(rank, f"a2a{j}", numel=2 * r).view(r, 2) for j, r in enumerate(rows_in)]
        outs = [torch.empty(r, 2) for r in rows_out]
        dist.all_to_all(outs, src, group=group)
        return outs
    case("all_to_all/even", lambda: all_to_all(True))
    case("all_to_all/uneven", lambda: all_to_all(False))

    def gather(dst: int, async_op: bool = False) -> list[Any]:
        outs = [torch.empty(N) for _ in range(n)] if rank == dst else None
        _wait(dist.gather(inputs(rank, "ga"), outs, dst, group=group, async_op=async_op), async_op)
        return outs or []
    for dst in (0, n - 1):
        case(f"gather/dst{dst}", lambda dst=dst: gather(dst))
    case("gather/async", lambda: gather(1, True))

    def scatter(src: int, async_op: bool = False) -> list[Any]:
        out = torch.empty(N)
        pieces = [inputs(rank, f"sc{j}") for j in range(n)] if rank == src else None
        _wait(dist.scatter(out, pieces, src, group=group, async_op=async_op), async_op)
        return [out]
    for src in (0, n - 1):
        case(f"scatter/src{src}", lambda src=src: scatter(src))
    case("scatter/async", lambda: scatter(1, True))

    nxt, prv = (rank + 1) % n, (rank - 1) % n

    def send_recv(tag: int) -> list[Any]:
        got = torch.empty(N, dtype=torch.float64)
        for step in ((0, 1) if rank == 0 else (1, 0)):  # rank 0 sends first: a ring without deadlock
            if step == 0:
                dist.send(inputs(rank, "p2p", torch.float64), nxt, group=group, tag=tag)
            else:
                dist.recv(got, prv, group=group, tag=tag)
        return [got]
    case("send_recv", lambda: send_recv(0))
    case("send_recv/tag", lambda: send_recv(7))

    def strided(kind: str) -> list[Any]:
        t = inputs(rank, "str", numel=2 * N).view(N, 2)[:, 0]  # every other element: not contiguous
        if kind == "all_reduce":
            dist.all_reduce(t, group=group)
        elif rank == 0:  # the ring of send_recv below: every rank sends or receives first
            dist.send(t, nxt, group=group)
            dist.recv(t, prv, group=group)
        else:
            dist.recv(t, prv, group=group)
            dist.send(t, nxt, group=group)
        return [t]
    case("all_reduce/strided", lambda: strided("all_reduce"))
    case("send_recv/strided", lambda: strided("p2p"))

    def isend_irecv() -> list[Any]:
        got = torch.empty(3, 2, dtype=torch.int32)
        works = [dist.isend(inputs(rank, "i", torch.int32).view(3, 2), nxt, group=group),
                 dist.irecv(got, prv, group=group)]
        for work in works:
            work.wait()
        return [got]
    case("isend_irecv", isend_irecv)

    def batch() -> list[Any]:
        a, b = torch.empty(N), torch.empty(2 * N)
        ops = [dist.P2POp(dist.isend, inputs(rank, "b1"), nxt, group), dist.P2POp(dist.irecv, a, prv, group),
               dist.P2POp(dist.isend, inputs(rank, "b2", numel=2 * N), prv, group),
               dist.P2POp(dist.irecv, b, nxt, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return [a, b]
    case("batch_isend_irecv", batch)

    def barrier(async_op: bool) -> list[Any]:
        _wait(dist.barrier(group=group, async_op=async_op), async_op)
        return []
    case("barrier", lambda: barrier(False))
    case("barrier/async", lambda: barrier(True))
    case("monitored_barrier", lambda: [dist.monitored_barrier(group=group, wait_all_ranks=True)])

    def all_reduce_coalesced(async_op: bool) -> list[Any]:
        ts = [inputs(rank, "arc1"), inputs(rank, "arc2", numel=3)]
        _wait(dist.all_reduce_coalesced(ts, dist.ReduceOp.MAX, group=group, async_op=async_op), async_op)
        return ts
    case("all_reduce_coalesced", lambda: all_reduce_coalesced(False))
    case("all_reduce_coalesced/async", lambda: all_reduce_coalesced(True))

    def coalescing(kind: str, async_ops: bool) -> list[Any]:
        outs: list[torch.Tensor] = []
        with dist._coalescing_manager(group, async_ops=async_ops) as cm:
            for i in range(3):
                if kind == "all_reduce":
                    outs.append(inputs(rank, f"cm{i}", numel=N + i))
                    dist.all_reduce(outs[-1], op=dist.ReduceOp.PRODUCT, group=group)
                elif kind == "all_gather":
                    outs.append(torch.empty(n * (N + i)))
                    dist.all_gather_into_tensor(outs[-1], inputs(rank, f"cg{i}", numel=N + i), group=group)
                else:
                    outs.append(torch.empty(N + i))
                    dist.reduce_scatter_tensor(outs[-1], inputs(rank, f"cr{i}", numel=n * (N + i)), group=group)
        if async_ops:
            cm.wait()
        return outs
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        for async_ops in (False, True):
            case(f"_coalescing_manager/{kind}/{'async' if async_ops else 'sync'}",
                 lambda kind=kind, async_ops=async_ops: coalescing(kind, async_ops))

    def objects() -> list[Any]:
        gathered: list[Any] = [None] * n
        dist.all_gather_object(gathered, {"r": rank}, group=group)
        listed: list[Any] = [{"x": rank}, rank * 10]
        dist.broadcast_object_list(listed, src=n - 1, group=group)
        mine: list[Any] = [None]
        dist.scatter_object_list(mine, [f"to{j}" for j in range(n)] if rank == 0 else None, src=0, group=group)
        at_root: list[Any] | None = [None] * n if rank == 1 else None
        dist.gather_object(("g", rank), at_root, dst=1, group=group)
        return [gathered, listed, mine, at_root]
    case("object_collectives", objects)
    return out


def main(out_dir: str) -> None:
    """One rank: the suite on the emulated default group, then on plain gloo; both outcomes saved."""
    dist.init_process_group("gloo")  # the emulating backend: `geotrain emulate` installed it
    rank, n = dist.get_rank(), dist.get_world_size()
    # install() wrapped new_group so that "gloo" means the emulating backend; torch's own (the wrapped
    # original) gives a plain ProcessGroupGloo over the same ranks
    plain = dist.new_group.__wrapped__(backend="gloo")
    assert dist.get_backend(plain) == "gloo" and dist.get_backend() == "geotrain_emulate"
    results = {"emulated": suite(None, rank, n), "gloo": suite(plain, rank, n)}
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()


# 3 devices in one region; time scale 0: the emulated clocks run, nobody sleeps
CLUSTER = cluster_from_dict({"name": "c3", "regions": [{"name": "a", "devices": 3, "intra": {"gbps": 10, "ms": 1}}]})
# what gloo (torch 2.13) refuses, and the emulating backend with it, with the same exception
GLOO_REFUSES = {
    "all_reduce/AVG/torch.int64": "RuntimeError: result type Float can't be cast to the desired output type Long",
    "all_reduce/BAND/torch.float32": "RuntimeError: Cannot use ReduceOp.BAND with non-integral dtype",
    "all_reduce/BOR/torch.float32": "RuntimeError: Cannot use ReduceOp.BOR with non-integral dtype",
    "all_reduce/BXOR/torch.float32": "RuntimeError: Cannot use ReduceOp.BXOR with non-integral dtype",
    "all_reduce/PREMUL_SUM": "RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo",
    "all_gather_into_tensor/stack": "RuntimeError: ProcessGroupGloo::allgather: invalid tensor size",
    "all_to_all/uneven": "RuntimeError: ProcessGroupGloo::alltoall: invalid tensor size",
    "send_recv/strided": "RuntimeError: input tensor has to be contiguous",  # on the sender and the receiver
}


def same(a: Any, b: Any) -> bool:
    """Bit for bit: tensors of one dtype and shape with equal bytes; containers and objects recursively."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a.contiguous().view(-1).view(torch.uint8),
                                                       b.contiguous().view(-1).view(torch.uint8)))
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_and_reduce_op_matches_plain_gloo_bit_for_bit(tmp_path, monkeypatch, n):
    paths = [str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))  # the ranks run this file: paths on their path
    monkeypatch.setenv("PYTHONWARNINGS", "ignore::FutureWarning")  # torch deprecates the old names we call
    result = launch(CLUSTER, list(range(n)), LaunchConfig((__file__, str(tmp_path)), 0.0, timeout_s=120))
    assert result.exit_code == 0, result.rank_codes
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(n)]
    for rank, outcome in enumerate(ranks):
        emulated, gloo = outcome["emulated"], outcome["gloo"]
        assert list(emulated) == list(gloo) and len(gloo) == 80
        differ = [name for name in gloo if not same(emulated[name], gloo[name])]
        assert differ == [], f"rank {rank}: emulated != gloo for {differ}"
        refused = {name: o[1] for name, o in gloo.items() if isinstance(o, tuple)}
        assert sorted(refused) == sorted(GLOO_REFUSES)
        assert all(refused[name].startswith(text) for name, text in GLOO_REFUSES.items())

    # the harness itself: a few outcomes by hand (both backends wrong alike would pass the above)
    one = ranks[n - 1]["gloo"]
    f64 = sum(inputs(r, "storch.float64", torch.float64) for r in range(n))
    assert torch.allclose(one["all_reduce/SUM/torch.float64"][0], f64, rtol=1e-12)
    xor = inputs(0, "all_reduce/BXOR/torch.int64", torch.int64)
    for r in range(1, n):
        xor = xor ^ inputs(r, "all_reduce/BXOR/torch.int64", torch.int64)
    assert torch.equal(one["all_reduce/BXOR/torch.int64"][0], xor)
    rows = [[(r + j) % 3 + 1 for j in range(n)] for r in range(n)]  # rows[r][j]: rank r sends j
    pieces = [inputs(r, "a2as", numel=2 * sum(rows[r])).view(-1, 2).split(rows[r]) for r in range(n)]
    assert torch.equal(one["all_to_all_single/uneven"][0], torch.cat([pieces[r][n - 1] for r in range(n)]))
    assert one["object_collectives"][2] == [f"to{n - 1}"]


if __name__ == "__main__":
    main(sys.argv[1])
