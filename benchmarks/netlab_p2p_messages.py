"""The same point-to-point messages over really shaped links and through the emulator's timing, side by side.

Two lab devices in two regions joined by one link (default 5 Mbit/s, 0.5 ms: the netlab runtime bench's
inter-region link). Each step, rank 0 hands `--messages` messages of `--bytes` to rank 1 (`dist.isend`,
`--gap-ms` of "compute" before each), then rank 1 sends as many back (a GPipe stage's activations
forward, gradients back: the planned plan's pipeline cut), then both pause `--pause-ms` (optimizer).
Over real TCP in the lab (gloo, htb), each message's hand-off and arrival (the receiver's `wait()`
returning) are stamped with CLOCK_MONOTONIC, which all namespaces share. The emulator's column is
geotrain.emulate.schedule.SenderQueues (the FIFO link model the emulating backend times every send
with) fed the same hand-off times. Run as root:

    python benchmarks/netlab_p2p_messages.py [--mbps 5] [--bytes 98304] [--messages 4] [--steps 4] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def worker(args: argparse.Namespace) -> None:
    """One rank of the message sequence; prints `REC <json>` with (kind, step, direction, msg, t)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    buf = torch.zeros(args.bytes // 4)
    records = []
    dist.barrier()
    for step in range(args.steps):
        for direction, (src, dst) in enumerate(((0, 1), (1, 0))):
            if rank == src:
                works = []
                for m in range(args.messages):
                    time.sleep(args.gap_ms / 1e3)
                    records.append(("send", step, direction, m, time.monotonic()))
                    works.append(dist.isend(buf, dst))
                for work in works:
                    work.wait()
            else:
                for m in range(args.messages):
                    dist.irecv(buf, src).wait()
                    records.append(("recv", step, direction, m, time.monotonic()))
        time.sleep(args.pause_ms / 1e3)
    dist.barrier()
    print("REC " + json.dumps(records), flush=True)
    dist.destroy_process_group()


def measure(args: argparse.Namespace) -> dict:
    from geotrain.cluster import make_network
    from geotrain.emulate.network import EmulatedNetwork
    from geotrain.emulate.schedule import SenderQueues
    from geotrain.netlab import NetLab, run_script

    gbps = args.mbps / 1e3
    cluster = make_network([1, 1], 10.0, (gbps, gbps), (args.latency_ms, args.latency_ms), seed=0, name="pair")
    argv = [sys.executable, __file__, "--worker", *sys.argv[1:]]
    with NetLab(cluster, [0, 1]) as lab:
        results = run_script(lab, argv, timeout_s=300, capture=True)
    records = []
    for result in results:
        if result.returncode != 0:
            raise SystemExit(f"rank {result.rank} failed: {result.output[-1000:]}")
        records += json.loads(next(line[4:] for line in result.output.splitlines() if line.startswith("REC ")))
    sent = {tuple(r[1:4]): r[4] for r in records if r[0] == "send"}
    arrived = {tuple(r[1:4]): r[4] for r in records if r[0] == "recv"}
    network = EmulatedNetwork.from_cluster(cluster, time_scale=0.0)
    queues = [SenderQueues(network, 0), SenderQueues(network, 1)]
    rows = []
    for key in sorted(sent, key=sent.get):
        step, direction, m = key
        _start, _done, arrival = queues[direction].send(1 - direction, float(args.bytes), sent[key])
        rows.append({"step": step, "direction": "fwd" if direction == 0 else "bwd", "message": m,
                     "shaped_s": arrived[key] - sent[key], "emulator_s": arrival - sent[key]})
    spans = []
    for step in range(args.steps):
        for direction in ("fwd", "bwd"):
            mine = [(r, sent[(r["step"], 0 if direction == "fwd" else 1, r["message"])]) for r in rows
                    if r["step"] == step and r["direction"] == direction]
            first = min(t for _, t in mine)
            spans.append({"step": step, "direction": direction,
                          "shaped_s": max(t + r["shaped_s"] for r, t in mine) - first,
                          "emulator_s": max(t + r["emulator_s"] for r, t in mine) - first})
    steady = [s for s in spans if s["step"] > 0] or spans
    return {"link": {"mbps": args.mbps, "latency_ms": args.latency_ms}, "bytes": args.bytes,
            "alone_s": 8 * args.bytes / (args.mbps * 1e6) + args.latency_ms / 1e3, "messages": rows, "spans": spans,
            "median_span_ratio": statistics.median(s["emulator_s"] / s["shaped_s"] for s in steady)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbps", type=float, default=5.0)
    parser.add_argument("--latency-ms", type=float, default=0.5)
    parser.add_argument("--bytes", type=int, default=98_304)
    parser.add_argument("--messages", type=int, default=4)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--pause-ms", type=float, default=100.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    result = measure(args)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.bytes} B over {args.mbps:g} Mbit/s: {result['alone_s'] * 1e3:.1f} ms alone")
    print("step dir msg  shaped ms  emulator ms")
    for r in result["messages"]:
        print(f"{r['step']:4d} {r['direction']} {r['message']:3d} {r['shaped_s'] * 1e3:10.1f} {r['emulator_s'] * 1e3:12.1f}")
    for s in result["spans"]:
        print(f"step {s['step']} {s['direction']}: first hand-off to last arrival: shaped {s['shaped_s'] * 1e3:.1f} ms, "
              f"emulator {s['emulator_s'] * 1e3:.1f} ms")
    print(f"median emulator / shaped span (steps 1..): {result['median_span_ratio']:.3f}")


if __name__ == "__main__":
    main()
