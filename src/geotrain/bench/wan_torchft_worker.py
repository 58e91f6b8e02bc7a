"""One replica of `bench wan`'s torchft row: torchft's DiLoCo run as its users run it, on emulated links.

Run as `python -m geotrain.bench.wan_torchft_worker CONFIG.json REPLICA` by geotrain.bench.wan_torchft
(which starts the Lighthouse). The replica is a replica group of one process, as with torchrun per
replica group: its own TCPStore, a `torchft.Manager` over `torchft.ProcessGroupGloo` (use_async_quorum
False, as DiLoCo requires), and `torchft.local_sgd.DiLoCo(manager, fragments, inner, outer_optimizers,
sync_every, should_quantize, fragment_sync_delay, use_bucketization=True)` around an ordinary loop.
The only geotrain code around torchft: `TorchftGroups` (each quorum's gloo group is emulated on the
cluster's links) and the bench's own model, data, schedule and records, the same as the runtime's
(geotrain.runtime: TinyGPT from the seed, replica_batch(data seed, step, replica), AdamW betas 0.9/0.95,
weight decay 0.1, lr_at warm-up + cosine), so the row differs from geotrain's only in the outer sync.
Writes `records-<replica>.json` (per step: emulated start/end, compute seconds, inter-region bytes) and,
replica 0, the model's weights at the evaluation steps (`step-<n>.pt`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from geotrain.cluster import cluster_from_dict
from geotrain.emulate.clock import RankClock
from geotrain.emulate.install import COMPUTE_CLOCKS
from geotrain.emulate.network import EmulatedNetwork
from geotrain.emulate.schedule import inter_region_traffic
from geotrain.emulate.torchft_groups import TorchftGroups
from geotrain.models import MODEL_PRESETS, even_boundaries, lm_loss, lr_at
from geotrain.procs import die_with_parent
from geotrain.runtime.stages import build_layer_model, stage_modules
from geotrain.runtime.training_data import load_training_data
from geotrain.sync.factory import BETAS, WEIGHT_DECAY

TIMEOUT = timedelta(seconds=180)


def fragments_of(module: torch.nn.Module, count: int) -> list[torch.nn.Module]:
    """The model's layers cut into `count` contiguous fragments (torchft takes a list of modules)."""
    layers = list(module.layers)  # type: ignore[arg-type]
    cuts = even_boundaries(len(layers), count)
    return [torch.nn.ModuleList(layers[a:b]) for a, b in zip(cuts, cuts[1:])]


def train(cfg: dict[str, Any], replica: int, out: Path) -> None:
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    cluster = cluster_from_dict(cfg["cluster"], "bench wan torchft")
    data = load_training_data(None, cfg["data_seed"], 0.1)
    model_spec = build_layer_model(cfg["model"], MODEL_PRESETS, cfg["seed"], data.vocab_size, cfg["seq_len"])
    model = stage_modules(model_spec, even_boundaries(model_spec.n_layers, 1), [0])[0]
    inner = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=BETAS, weight_decay=WEIGHT_DECAY)
    fragments = fragments_of(model, cfg["fragments"])
    outer = [torch.optim.SGD(f.parameters(), lr=cfg["outer_lr"], momentum=cfg["outer_momentum"],
                             nesterov=cfg["outer_momentum"] > 0) for f in fragments]
    clock = RankClock(cfg["time_scale"], wall=COMPUTE_CLOCKS[cfg["compute_clock"]])
    network = EmulatedNetwork.from_cluster(cluster, cfg["time_scale"])
    device, region_of, replicas = cfg["devices"][replica], cluster.region_of, len(cfg["devices"])
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    records: list[dict[str, Any]] = []
    with TorchftGroups(network, device, clock=clock) as emulated:
        manager = Manager(pg=ProcessGroupGloo(timeout=TIMEOUT), min_replica_size=replicas, use_async_quorum=False,
                          load_state_dict=lambda state: (model.load_state_dict(state["model"]),
                                                         inner.load_state_dict(state["inner"])),
                          state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
                          replica_id=f"bench_wan_{replica}", store_addr="127.0.0.1", store_port=store.port,
                          rank=0, world_size=1, lighthouse_addr=cfg["lighthouse"], timeout=TIMEOUT,
                          quorum_timeout=TIMEOUT, connect_timeout=TIMEOUT, init_sync=cfg["init_sync"])
        inner_done = [0.0]
        # registered before DiLoCo's: runs first, so the inner step's end is known before the outer sync
        inner.register_step_post_hook(lambda *_: inner_done.__setitem__(0, time.perf_counter()))
        with DiLoCo(manager, fragments, inner, outer, sync_every=cfg["sync_every"],
                    should_quantize=cfg["should_quantize"], fragment_sync_delay=cfg["delay"],
                    use_bucketization=True):
            clock.restart(0.0)
            for step in range(cfg["steps"]):
                start_s, mark = clock.now(), emulated.transfer_mark()
                began = time.perf_counter()
                x, y = data.batch(cfg["data_seed"], step, replica, replicas, cfg["per_replica"], cfg["seq_len"])
                for group in inner.param_groups:
                    group["lr"] = lr_at(step, cfg["steps"], cfg["lr"])
                inner.zero_grad(set_to_none=True)
                lm_loss(model(x), y).backward()
                inner.step()
                records.append({"step": step, "rank": replica, "compute_s": inner_done[0] - began,
                                "emulated": {"start_s": start_s, "end_s": clock.now(),
                                             **inter_region_traffic(emulated.transfers_since(mark), region_of)}})
                if replica == 0 and step + 1 in cfg["eval_steps"]:
                    torch.save(model.state_dict(), out / f"step-{step + 1}.pt")
        (out / f"records-{replica}.json").write_text(json.dumps(
            {"records": records, "bytes_sent": emulated.bytes_sent(),
             "inter_region_bytes": emulated.bytes_sent(region_of), "quorums": len(emulated.groups)}))
        manager.shutdown(wait=False)


def main(argv: list[str]) -> None:
    die_with_parent()
    torch.set_num_threads(1)
    cfg = json.loads(Path(argv[0]).read_text())
    train(cfg, int(argv[1]), Path(argv[0]).parent)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # without the interpreter's teardown of gloo's and torchft's threads (see emulate.bootstrap)


if __name__ == "__main__":
    main(sys.argv[1:])
