"""Distributed PowerSGD as our DDP hook, in real gloo processes: any bucket layout, equal to the in-process
simulation, exact on low-rank gradients, bytes as declared, state saved and restored exactly."""

from dataclasses import asdict, replace

import pytest
import torch
from ddp_checkpointing import MANY_BUCKETS_MB, TINY

from geotrain.bench.ddp import DDPRun, run_ddp
from geotrain.comm import PowerSGDConfig, PowerSGDLayout, run_workers, wire_bytes
from geotrain.models import make_model
from geotrain.sim import ExchangeThenStep, GradientExchange, TrainConfig, make_optimizer, train_compressed


def _powersgd_exchange(named_shapes, workers, config=PowerSGDConfig()):
    """The simulated trainer's exchange through the `powersgd` reducer with `config`'s settings."""
    return GradientExchange("powersgd", named_shapes, workers, **asdict(config))

BASE = TrainConfig(model=TINY, steps=6, workers=2, batch=8, codec="powersgd", error_feedback=True,
                   codec_params={"rank": 2, "start_powersgd_iter": 1})


def _powersgd_rule(model, config):
    """train_compressed's update rule with distributed PowerSGD over the simulated workers."""
    params = list(model.parameters())
    exchange = _powersgd_exchange([(name, tuple(p.shape)) for name, p in model.named_parameters()], config.workers,
                                PowerSGDConfig(error_feedback=config.error_feedback, **dict(config.codec_params)))
    return ExchangeThenStep(params, exchange, make_optimizer(params, config), config.clip_norm)


def _simulate(rank, world_size, config):
    return train_compressed(config, update_rule=_powersgd_rule).losses


def _declared_per_run(config: TrainConfig) -> int:
    """Bytes one rank hands over the run, from the shapes alone: all gradients in fp32 before
    start_powersgd_iter, then the uncompressed values + P's and the Q's."""
    shapes = [(name, tuple(p.shape)) for name, p in make_model(config.model, 0).named_parameters()]
    layout = PowerSGDLayout.build(shapes, PowerSGDConfig(rank=config.codec_params["rank"]))
    n_params = sum(p.numel() for p in make_model(config.model, 0).parameters())
    start = config.codec_params["start_powersgd_iter"]
    per_step = 4 * (sum(layout.rows(i) * layout.ranks[i] + layout.cols(i) * layout.ranks[i] for i in layout.compressed)
                    + sum(layout.numel(i) for i in layout.uncompressed))
    return start * 4 * n_params + (config.steps - start) * per_step


def test_powersgd_hook_in_many_buckets_equals_one_bucket_and_the_simulation():
    """2 processes: gloo sums a + b as the simulation does, so losses agree bit for bit, in any layout."""
    many, one = run_ddp([DDPRun("many", BASE, bucket_cap_mb=MANY_BUCKETS_MB, evaluate=False),
                         DDPRun("one", BASE, bucket_cap_mb=1024.0, evaluate=False)], timeout_s=120)
    simulated = run_workers(_simulate, 1, (BASE,), timeout_s=120)[0]
    assert many.buckets_per_step == 4 and one.buckets_per_step == 1
    assert many.rank_losses == one.rank_losses
    assert many.losses == pytest.approx(simulated, rel=0, abs=0)
    assert simulated[-1] < simulated[0]
    for run in (many, one):
        assert run.handed_bytes == run.declared_bytes == _declared_per_run(BASE)
        assert run.wire_bytes == pytest.approx(wire_bytes("all_reduce", run.handed_bytes, 2))
        start = BASE.codec_params["start_powersgd_iter"]
        assert run.collective_calls == start + 2 * (BASE.steps - start)  # whatever the number of buckets


def test_powersgd_hook_with_four_processes_matches_the_simulation():
    """4 processes: gloo's ring all-reduce adds the 4 ranks' P and Q in another order than the
    simulation's rank-order sum, so each averaged value may differ in its last bits (~1e-7 relative),
    then QR and 6 AdamW steps carry that on. Measured: 1.7e-8 relative on the losses; tolerance 1e-6.
    Turning error feedback off moves them by 7.8e-4 (measured): the tolerance tells the two apart."""
    config = replace(BASE, workers=4, batch=16)
    many, = run_ddp([DDPRun("many", config, bucket_cap_mb=MANY_BUCKETS_MB, evaluate=False)], timeout_s=120)
    simulated = run_workers(_simulate, 1, (config,), timeout_s=120)[0]
    assert many.losses == pytest.approx(simulated, rel=1e-6, abs=0)
    no_feedback = run_workers(_simulate, 1, (replace(config, error_feedback=False),), timeout_s=120)[0]
    assert max(abs(a - b) / b for a, b in zip(no_feedback, simulated)) > 1e-4
    assert many.handed_bytes == many.declared_bytes == _declared_per_run(config)


class _Probe(torch.nn.Module):
    """Parameters whose gradient is whatever the forward pass is given: loss = sum_k <param_k, target_k>."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(24, 3, 6))  # a 24 x 18 matrix
        self.b = torch.nn.Parameter(torch.zeros(30, 20))
        self.c = torch.nn.Parameter(torch.zeros(16, 40))
        self.bias = torch.nn.Parameter(torch.zeros(30))

    def forward(self, targets):
        return sum((param * target).sum() for param, target in zip(self.parameters(), targets, strict=True))


def _low_rank_round(rank, world_size):
    """Gradients per rank: a = u_rank v_rank^T (the mean has rank 2), b = the same rank-1 matrix on every
    rank (rank-deficient for r = 2), c = 0, bias arbitrary. Two steps with rank 2, from step 0."""
    from torch.nn.parallel import DistributedDataParallel

    from geotrain.codecs import CodecError, PowerSGDCodec
    from geotrain.ddp import register_codec_hook

    results = {"errors": []}
    for bad in ({"granularity": "bucket"}, {"start_iter": 3}):
        try:
            register_codec_hook(DistributedDataParallel(_Probe()), "powersgd", **bad)
        except CodecError as exc:
            results["errors"].append(str(exc))
    instance_state = register_codec_hook(DistributedDataParallel(_Probe()), PowerSGDCodec(rank=3, seed=5))
    results["instance_config"] = (instance_state.reducer.config.rank, instance_state.reducer.config.seed)

    model = _Probe()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.002)  # ~2 kB buckets: 3 of them from the second step
    state = register_codec_hook(ddp, "powersgd", rank=2, start_powersgd_iter=0)
    steps = []
    for step in range(2):
        per_rank = []
        for r in range(world_size):
            g = torch.Generator().manual_seed(100 * step + r)
            shared = torch.Generator().manual_seed(100 * step + 99)
            a = torch.randn(24, 1, generator=g) @ torch.randn(1, 18, generator=g)
            b = torch.randn(30, 1, generator=shared) @ torch.randn(1, 20, generator=shared)
            per_rank.append([a.view(24, 3, 6), b, torch.zeros(16, 40), torch.randn(30, generator=g)])
        model.zero_grad()
        ddp(per_rank[rank]).backward()
        means = [sum(targets[k] for targets in per_rank) / world_size for k in range(4)]
        steps.append({"grads": [p.grad.clone() for p in model.parameters()], "means": means,
                      "residuals": {name: r.clone() for name, r in state.reducer.residuals[0].items()}})
    results["steps"] = steps
    results["buckets"] = state.buckets_per_step
    return results


def test_powersgd_hook_reconstructs_a_low_rank_mean_gradient_exactly():
    results = run_workers(_low_rank_round, 2, timeout_s=120)
    for rank_result in results:
        assert len(rank_result["errors"]) == 2
        assert "granularity must be 'tensor'" in rank_result["errors"][0]
        assert "no parameter(s) start_iter" in rank_result["errors"][1]
        assert rank_result["instance_config"] == (3, 5)
        assert rank_result["buckets"] == 3  # bias + a share one ~2 kB bucket; b and c have their own
        for step in rank_result["steps"]:
            for grad, mean in zip(step["grads"], step["means"], strict=True):
                assert torch.isfinite(grad).all()
                assert torch.allclose(grad, mean, rtol=0, atol=1e-5 * (1 + float(mean.abs().max())))
            assert torch.equal(step["grads"][3], step["means"][3])  # the bias goes uncompressed: (g0 + g1) / 2
            # the basis holds every worker's matrix, so nothing is left for later
            assert max(float(r.abs().max()) for r in step["residuals"].values()) < 1e-5
    assert all(torch.equal(x, y) for x, y in zip(results[0]["steps"][1]["grads"], results[1]["steps"][1]["grads"]))


def _check_restored(state, saved):
    restored = state.state_dict()
    assert restored["iteration"] == saved["hook"]["iteration"]
    for key in ("qs", "residuals"):
        assert restored[key].keys() == saved["hook"][key].keys()
        assert all(torch.equal(restored[key][name], saved["hook"][key][name]) for name in restored[key])


def _train_with_checkpoint(rank, world_size, steps, saved):
    """AdamW + our PowerSGD hook (rank 2, error feedback, compressing from step 0) on the tiny GPT;
    many buckets, or one bucket when resuming from `saved`."""
    from ddp_checkpointing import train_with_checkpoint

    from geotrain.ddp import register_codec_hook

    return train_with_checkpoint(rank, steps, saved, lambda ddp: register_codec_hook(ddp, "powersgd", rank=2),
                                 _check_restored)

def _resume_rank(rank, world_size, saved):
    return _train_with_checkpoint(rank, world_size, 3, saved[rank])


def test_powersgd_hook_state_restores_exactly_into_another_bucket_layout():
    straight = run_workers(_train_with_checkpoint, 2, (6, None), timeout_s=120)
    first = run_workers(_train_with_checkpoint, 2, (3, None), timeout_s=120)
    hook = first[0]["hook"]
    matrices = [name for name, p in make_model(TINY, 0).named_parameters() if p.ndim == 2]
    assert hook["codec"] == "powersgd" and hook["iteration"] == 3
    assert sorted(hook["qs"]) == sorted(hook["residuals"]) == sorted(matrices)
    assert torch.equal(first[0]["hook"]["qs"][matrices[0]], first[1]["hook"]["qs"][matrices[0]])  # shared basis
    resumed = run_workers(_resume_rank, 2, (first,), timeout_s=120)
    for rank in range(2):
        assert first[rank]["losses"] + resumed[rank]["losses"] == straight[rank]["losses"]
