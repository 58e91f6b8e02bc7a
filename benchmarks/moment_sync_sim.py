"""Moment sync in one process: R replicas of bench wan's tiny GPT trained side by side, to compare DDP, local
SGD and local SGD with the inner AdamW's moments averaged, over several seeds, in seconds instead of a bench run.

    PYTHONPATH=src python benchmarks/moment_sync_sim.py [--seeds 0 1 2] [--rows ddp,local,moments,...]
                                                        [--sync-every H] [--json OUT]

An independent implementation of what the runtime does (geotrain.sync.moments, geotrain.sync.streaming):
each replica is a model and a torch AdamW on its quarter of bench wan's batch (the same world text, batches,
model, learning-rate schedule, betas and weight decay as `geotrain bench wan`); a sync averages the replicas'
parameters (and with moment sync their exp_avg and exp_avg_sq) exactly, or through geotrain codecs as deltas
from the last agreed values with error feedback (the second moment as values, through log-block). Eager
landing with delay tau: each replica keeps training from its own weights and moments for tau steps and
then moves by (mean - what it sent). With seed 0 it reproduces bench wan's losses: DDP 2.2770 and local
SGD H=5 2.3101 at step 60, to 4 digits. Validation: 128 windows, at the steps a bench row is scored
(every 5 steps, tau later for a delayed row, and 60).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
from dataclasses import dataclass

import numpy as np
import torch

from geotrain.codecs import NonFiniteGradientError, get_codec
from geotrain.models import MODEL_PRESETS
from geotrain.models.evaluate import validation_loss
from geotrain.models.layers import lm_loss
from geotrain.models.schedule import lr_at
from geotrain.runtime.stages import build_layer_model
from geotrain.runtime.training_data import load_training_data

REPLICAS, BATCH, STEPS, LR, MICROBATCHES, TARGET = 4, 32, 60, 3e-3, 4, 2.4


@dataclass(frozen=True)
class Row:
    """One training: `sync_every` None is DDP (the mean gradient every step)."""

    label: str
    sync_every: int | None = 5
    moments: tuple[str, ...] = ()  # of "exp_avg", "exp_avg_sq": the AdamW moments averaged at each sync
    delay: int = 0
    warmup: int = 0
    codec: str | None = None  # outer gradients and first moment; None: exact means
    second_codec: str = "log-block"  # the second moment's, when `codec` is set
    moment_syncs: int | None = None  # only the first N syncs average the moments (None: every sync)


BOTH = ("exp_avg", "exp_avg_sq")
ROWS = {
    "ddp": Row("DDP (mean gradient every step)", sync_every=None),
    "local": Row("local SGD H=5"),
    "local-int8": Row("local SGD H=5, int8-block", codec="int8-block"),
    "first-moment": Row("local SGD H=5 + first moment averaged", moments=("exp_avg",)),
    "second-moment": Row("local SGD H=5 + second moment averaged", moments=("exp_avg_sq",)),
    "moments": Row("local SGD H=5 + moment sync", moments=BOTH),
    "moments-int8-v": Row("local SGD H=5 + moment sync, all int8-block (v too)", moments=BOTH, codec="int8-block",
                          second_codec="int8-block"),
    "moments-int4": Row("local SGD H=5 + moment sync, int4-block + log-block", moments=BOTH, codec="int4-block"),
    "eager-moments-int4": Row("eager tau=2 warm-up 10 + moment sync, int4-block + log-block", moments=BOTH,
                              codec="int4-block", delay=2, warmup=10),
    "eager3-moments": Row("eager tau=3 warm-up 10 + moment sync", moments=BOTH, delay=3, warmup=10),
    "eager-wu5-moments": Row("eager tau=2 warm-up 5 + moment sync", moments=BOTH, delay=2, warmup=5),
    "h10-moments": Row("local SGD H=10 + moment sync", sync_every=10, moments=BOTH),
    "moments-int4-first2": Row("local SGD H=5 + moment sync in the first 2 syncs, int4-block + log-block",
                               moments=BOTH, codec="int4-block", moment_syncs=2),
    "eager-moments-int4-first2": Row("eager tau=2 warm-up 10 + moment sync in the first 2 syncs, int4 + log-block",
                                     moments=BOTH, codec="int4-block", delay=2, warmup=10, moment_syncs=2),
    "eager-moments-int4-first1": Row("eager tau=2 warm-up 10 + moment sync in the first sync, int4 + log-block",
                                     moments=BOTH, codec="int4-block", delay=2, warmup=10, moment_syncs=1),
    "eager-int4": Row("eager tau=2 warm-up 10, int4-block (no moment sync)", codec="int4-block", delay=2, warmup=10),
}


class Exchange:
    """Means of the replicas' flat groups (parameters, exp_avg, exp_avg_sq), exact or through codecs."""

    def __init__(self, codec: str | None, second_codec: str, kinds: list[str], anchors: list[torch.Tensor]) -> None:
        self.codec = None if codec is None else get_codec(codec)
        self.second = get_codec(second_codec)
        self.kinds = kinds  # per group: "param", "exp_avg" or "exp_avg_sq"
        self.anchors = anchors  # the last agreed values of the delta-coded groups
        self.residuals: dict[tuple[int, int], torch.Tensor] = {}

    def means(self, groups: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        """groups[r][g]: replica r's flat group g (of kind self.kinds[g])."""
        result = []
        for g in range(len(groups[0])):
            values = [replica[g] for replica in groups]
            if self.codec is None:
                result.append(sum(values) / len(values))
            elif self.kinds[g] == "exp_avg_sq":  # values through the second moment's codec, no error feedback
                result.append(sum(self.second.roundtrip(v)[0] for v in values) / len(values))
            else:
                total = torch.zeros_like(values[0])
                for r, v in enumerate(values):
                    delta = v - self.anchors[g] + self.residuals.get((g, r), 0)
                    decoded = self.codec.roundtrip(delta)[0]
                    self.residuals[(g, r)] = delta - decoded
                    total += decoded
                result.append(self.anchors[g] + total / len(values))
        for g in range(len(result)):
            if self.kinds[g] != "exp_avg_sq":
                self.anchors[g] = result[g].clone()
        return result


def train(row: Row, seed: int) -> dict[int, float]:
    """Validation loss (nats) at the scoring steps of `row` with model and data seed `seed`; a run whose
    replicas send NaN/inf ends there, with a NaN loss at that step."""
    torch.manual_seed(seed)
    data = load_training_data(None, seed, 0.1)
    model = build_layer_model("tiny", MODEL_PRESETS, seed, data.vocab_size, None)
    net = torch.nn.Sequential(*model.layers)
    count = 1 if row.sync_every is None else REPLICAS
    nets = [copy.deepcopy(net) for _ in range(count)]
    opts = [torch.optim.AdamW(n.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1) for n in nets]
    params = [list(n.parameters()) for n in nets]

    def flat(r: int) -> list[torch.Tensor]:
        groups = [torch.cat([p.detach().reshape(-1) for p in params[r]])]
        for key in row.moments:
            groups.append(torch.cat([opts[r].state[p][key].reshape(-1) for p in params[r]]))
        return groups

    kinds = ["param", *row.moments]

    def add(r: int, group: int, change: torch.Tensor) -> None:
        start = 0
        for p in params[r]:
            target = p.data if kinds[group] == "param" else opts[r].state[p][kinds[group]]
            target.add_(change[start:start + p.numel()].view_as(p))
            if kinds[group] == "exp_avg_sq":
                target.clamp_(min=0)
            start += p.numel()

    numel = sum(p.numel() for p in params[0])
    anchors = [torch.cat([p.detach().reshape(-1) for p in params[0]])] + [torch.zeros(numel) for _ in row.moments]
    exchange = Exchange(row.codec, row.second_codec, kinds, anchors)
    syncs = 0
    pending: list[tuple[int, list[list[torch.Tensor]], list[torch.Tensor]]] = []
    offset = row.delay
    scored = {s for s in range(5 + offset, STEPS + 1, 5)} | {STEPS} if row.sync_every else set(range(5, STEPS + 1, 5))
    losses = {}
    for step in range(STEPS):
        lr = lr_at(step, STEPS, LR)
        for r, (n, opt) in enumerate(zip(nets, opts)):
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            for q in range(REPLICAS if row.sync_every is None else 1):
                x, y = data.batch(seed, step, q if row.sync_every is None else r, REPLICAS, BATCH // REPLICAS, 96)
                for xs, ys in zip(x.contiguous().chunk(MICROBATCHES), y.contiguous().chunk(MICROBATCHES)):
                    (lm_loss(n(xs), ys) / MICROBATCHES / (REPLICAS if row.sync_every is None else 1)).backward()
            opt.step()
        if row.sync_every is not None and ((step + 1) % row.sync_every == 0 or step + 1 == STEPS):
            syncs += 1
            travelling = kinds if row.moment_syncs is None or syncs <= row.moment_syncs else kinds[:1]
            exchange.kinds = travelling  # later syncs: the parameters alone (the moments' residuals are kept)
            sent = [flat(r)[:len(travelling)] for r in range(count)]
            try:
                means = exchange.means(sent)
            except NonFiniteGradientError:
                losses[step + 1] = float("nan")  # diverged: NaN/inf reached the exchange after this step
                return losses
            lands = step if step + 1 <= row.warmup or step + 1 == STEPS else step + row.delay
            pending.append((lands, sent, means))
        for item in [p for p in pending if p[0] <= step]:
            pending.remove(item)
            for r in range(count):
                for g, (mine, mean) in enumerate(zip(item[1][r], item[2])):
                    add(r, g, mean - mine)
        if step + 1 in scored:
            losses[step + 1] = round(validation_loss([nets[0]], np.asarray(data.val), 96, max_windows=128), 4)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rows", default="ddp,local,moments,moments-int4,eager-moments-int4",
                        help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--sync-every", type=int, metavar="H", help="every local SGD row's outer period (default 5)")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args()
    if args.sync_every is not None and args.sync_every < 1:
        parser.error(f"--sync-every must be >= 1, got {args.sync_every}")
    torch.set_num_threads(1)
    names = args.rows.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; known: {', '.join(ROWS)}")
    results = {}
    for seed in args.seeds:
        for name in names:
            row = ROWS[name]
            if args.sync_every is not None and row.sync_every is not None:
                row = dataclasses.replace(row, sync_every=args.sync_every,
                                          label=row.label.replace("H=5", f"H={args.sync_every}"))
            losses = train(row, seed)
            reached = next((s for s, loss in losses.items() if loss <= TARGET), None)
            results[f"{name}/{seed}"] = {"row": name, "seed": seed, "losses": losses, "target_step": reached}
            last = max(losses)
            end = f"loss@60 {losses[STEPS]:.4f}" if last == STEPS else f"diverged (non-finite after step {last})"
            print(f"seed {seed}  {row.label:62s} {end}  target {TARGET} at step "
                  f"{reached if reached is not None else '-'}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    sys.exit(main())
