"""Synchronous vs asynchronous DiLoCo on sleep-skewed ranks: wall time to the same total inner steps, final loss.

    PYTHONPATH=src python benchmarks/async_vs_sync.py --steps 60 --compute-s 0.01,0.015,0.02,0.04 [--json OUT.json]

Real gloo processes on this machine, one per rank; rank r sleeps compute_s[r] in every inner step (a site
of that speed: the default is a 4x spread). Every mode spends the same budget of inner steps, ranks x
--steps: synchronous DiLoCo runs --steps on every rank (each sync waits for the slowest); asynchronous
ones run until the global model holds ranks x --steps / H outer gradients (`outer_step`), whichever ranks
sent them. The loss is the final global model's mean squared error on a held-out set (the same on
every rank). Results: docs/guide/heterogeneous-sites-async.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist

from geotrain.comm import run_workers
from geotrain.diloco import DiLoCo

MODES = ("sync", "async", "async-hierarchical")


def _teacher_batch(generator: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 16, generator=generator)
    y = torch.sin(x[:, :1] * 1.5) + 0.5 * x[:, 1:2] * x[:, 2:3] - 0.3 * x[:, 3:4]
    return x, y


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 1))


def _run_rank(rank: int, world: int, mode: str, steps: int, sync_every: int, compute_s: list[float],
              staleness_bound: int, outer: tuple[float, float]) -> dict:
    torch.set_num_threads(1)
    model = _model()
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(1000 + rank)
    regions = [[0, 1], [2, 3]] if mode == "async-hierarchical" else None
    options = {} if mode == "sync" else {"asynchronous": True, "staleness_bound": staleness_bound, "regions": regions}
    target = world * steps // sync_every  # outer gradients in the global model: the same inner-step budget
    dist.barrier()
    started = time.perf_counter()
    with DiLoCo(model, inner, sync_every=sync_every, codec="none", outer_lr=outer[0], outer_momentum=outer[1],
                **options) as diloco:
        while (diloco.inner_steps < steps) if mode == "sync" else (diloco.outer_step < target):
            x, y = _teacher_batch(data, 32)
            loss = torch.nn.functional.mse_loss(model(x), y)
            inner.zero_grad()
            loss.backward()
            time.sleep(compute_s[rank])  # this site's compute
            inner.step()
    wall_s = time.perf_counter() - started
    x, y = _teacher_batch(torch.Generator().manual_seed(99), 2048)
    with torch.no_grad():
        val = float(torch.nn.functional.mse_loss(model(x), y))
    pushes = diloco.asynchronous.pushes if diloco.asynchronous is not None else diloco.inner_steps // sync_every
    return {"rank": rank, "wall_s": wall_s, "inner_steps": diloco.inner_steps, "val_loss": val, "outer_sends": pushes,
            "bytes_sent": diloco.bytes_sent,
            "fingerprint": float(sum(p.detach().double().sum() for p in model.parameters()))}


def run_mode(mode: str, steps: int, sync_every: int, compute_s: list[float], staleness_bound: int,
             outer: tuple[float, float] = (0.7, 0.9)) -> dict:
    results = run_workers(_run_rank, len(compute_s), (mode, steps, sync_every, compute_s, staleness_bound, outer),
                          timeout_s=900)
    if len({r["fingerprint"] for r in results}) != 1:
        raise RuntimeError(f"{mode}: ranks ended with different models: {[r['fingerprint'] for r in results]}")
    return {"mode": mode, "wall_s": max(r["wall_s"] for r in results),
            "total_inner_steps": sum(r["inner_steps"] for r in results),
            "inner_steps": [r["inner_steps"] for r in results], "outer_sends": [r["outer_sends"] for r in results],
            "val_loss": results[0]["val_loss"], "bytes_sent": [r["bytes_sent"] for r in results]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="inner steps per rank (the budget is ranks x steps)")
    parser.add_argument("--sync-every", type=int, default=5)
    parser.add_argument("--compute-s", default="0.01,0.015,0.02,0.04", help="seconds of sleep per inner step, per rank")
    parser.add_argument("--staleness-bound", type=int, default=8)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)
    compute_s = [float(v) for v in args.compute_s.split(",")]
    rows = [run_mode(mode, args.steps, args.sync_every, compute_s, args.staleness_bound,
                     (args.outer_lr, args.outer_momentum))
            for mode in args.modes.split(",")]
    print(f"{'mode':<20}{'wall s':>8}{'inner steps':>13}{'val loss':>10}  per rank (inner steps / outer sends)")
    for row in rows:
        per_rank = "  ".join(f"{s}/{o}" for s, o in zip(row["inner_steps"], row["outer_sends"], strict=True))
        print(f"{row['mode']:<20}{row['wall_s']:>8.2f}{row['total_inner_steps']:>13}{row['val_loss']:>10.4f}  "
              f"{per_rank}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"compute_s": compute_s, "steps": args.steps, "sync_every": args.sync_every, "rows": rows},
                      handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
