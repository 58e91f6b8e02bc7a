"""DiLoCo(sync_moments=True) in real gloo processes: after a blocking sync every replica's AdamW moments
are the replicas' means (exact with codec none; the second moment within log-block's relative bound
otherwise), all replicas agree bit for bit, one collective per sync carries both, and the bytes sent are
the codecs' declared bytes; eager landing ends with equal replicas; a non-Adam optimizer is refused."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from geotrain.codecs import get_codec
from geotrain.comm import run_workers
from geotrain.diloco import DiLoCo
from geotrain.sync import SyncError

H = 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.Tanh(), torch.nn.Linear(24, 1))


def _moments(inner: torch.optim.Optimizer, model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    states = [inner.state[p] for p in model.parameters()]
    return (torch.cat([s["exp_avg"].reshape(-1).clone() for s in states]),
            torch.cat([s["exp_avg_sq"].reshape(-1).clone() for s in states]))


def _loop(rank: int, world: int, codec: str, delay: int, steps: int, moment_syncs: int | None = None) -> dict:
    model = _model()
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(11 + rank)
    before: list = []
    after: list = []
    inner.register_step_post_hook(lambda *_: before.append(_moments(inner, model)))  # runs before DiLoCo's hook
    with DiLoCo(model, inner, sync_every=H, delay=delay, landing="eager" if delay else "mix",
                codec=codec, outer_lr=1.0, outer_momentum=0.0, sync_moments=True, moment_syncs=moment_syncs) as diloco:
        inner.register_step_post_hook(lambda *_: after.append(_moments(inner, model)))  # after DiLoCo's
        for _ in range(steps):
            x = torch.randn(16, 8, generator=data)
            loss = torch.nn.functional.mse_loss(model(x), x[:, :1] * x[:, 1:2])
            inner.zero_grad()
            loss.backward()
            inner.step()
    final = _moments(inner, model)
    return {"before": before, "after": after, "final": final, "bytes": diloco.bytes_sent,
            "declared": diloco.declared_bytes, "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
            "numel": sum(p.numel() for p in model.parameters())}


@pytest.mark.parametrize("codec", ["none", "int8-block"])
def test_blocking_sync_leaves_every_replica_with_the_mean_moments(codec):
    steps = 2 * H
    results = run_workers(_loop, 3, (codec, 0, steps), timeout_s=180)
    sync_step = H - 1
    mean_m = sum(r["before"][sync_step][0] for r in results) / 3
    mean_v = sum(r["before"][sync_step][1] for r in results) / 3
    assert not torch.equal(results[0]["before"][sync_step][0], results[1]["before"][sync_step][0])
    for r in results:
        m, v = r["after"][sync_step]
        assert torch.equal(m, results[0]["after"][sync_step][0]) and torch.equal(v, results[0]["after"][sync_step][1])
        assert torch.equal(r["params"], results[0]["params"])
    m, v = results[0]["after"][sync_step]
    if codec == "none":
        torch.testing.assert_close(m, mean_m, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(v, mean_v, rtol=1e-6, atol=1e-12)
    else:
        # first moment through int8-block (+ error feedback), second through log-block's relative levels
        assert float((m - mean_m).abs().max()) <= float(mean_m.abs().max()) * 3 / 127
        positive = mean_v > 0
        assert float((v[positive] / mean_v[positive]).log().abs().max()) < 3.0
        numel = results[0]["numel"]
        # the outer gradients and the first moment: one int8-block part each; the second moment: log-block
        per_sync = 2 * get_codec("int8-block").wire_nbytes((numel,)) + get_codec("log-block").wire_nbytes((numel,))
        syncs = steps // H  # the loop ends on a period's last step: the context's exit has nothing to send
        assert results[0]["declared"] == results[0]["bytes"] == per_sync * syncs


def test_moment_syncs_limits_the_moments_to_the_first_syncs():
    steps = 2 * H
    results = run_workers(_loop, 3, ("int8-block", 0, steps, 1), timeout_s=180)
    first, second = H - 1, 2 * H - 1
    for r in results:  # the first sync averaged the moments: every replica holds the same
        assert torch.equal(r["after"][first][0], results[0]["after"][first][0])
        assert torch.equal(r["after"][first][1], results[0]["after"][first][1])
        assert torch.equal(r["params"], results[0]["params"])
    # the second sync sent the outer gradients alone: the moments stay each replica's own, as its inner steps
    # left them (the loop ends on that sync's step, so the context's exit sends nothing more)
    assert not torch.equal(results[0]["after"][second][0], results[1]["after"][second][0])
    for r in results:
        assert torch.equal(r["after"][second][0], r["before"][second][0])
        assert torch.equal(r["after"][second][1], r["before"][second][1])
    numel = results[0]["numel"]
    plain = get_codec("int8-block").wire_nbytes((numel,))
    with_moments = 2 * plain + get_codec("log-block").wire_nbytes((numel,))
    assert results[0]["declared"] == results[0]["bytes"] == with_moments + plain


def test_eager_landing_with_moments_ends_with_equal_replicas():
    results = run_workers(_loop, 2, ("int4-block", 2, 3 * H), timeout_s=180)
    assert torch.equal(results[0]["params"], results[1]["params"])
    assert torch.equal(results[0]["final"][0], results[1]["final"][0])
    assert torch.equal(results[0]["final"][1], results[1]["final"][1])
    assert bool((results[0]["final"][1] >= 0).all())


def _sgd(rank: int, world: int) -> str:
    model = _model()
    try:
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=H, sync_moments=True)
    except SyncError as exc:
        return str(exc)
    return "accepted"


def test_an_optimizer_without_adam_moments_is_refused():
    assert "use torch.optim.AdamW or Adam" in run_workers(_sgd, 2, (), timeout_s=60)[0]


def _unused_parameter(rank: int, world: int) -> str:
    model = _model()
    spare = torch.nn.Linear(2, 2)  # trained on no data: AdamW never steps it
    params = [*model.parameters(), *spare.parameters()]
    inner = torch.optim.AdamW(params, lr=1e-2)
    holder = torch.nn.ModuleDict({"model": model, "spare": spare})
    try:
        with DiLoCo(holder, inner, sync_every=2, sync_moments=True):
            for _ in range(2):
                inner.zero_grad()
                model(torch.randn(4, 8)).pow(2).mean().backward()
                inner.step()
    except SyncError as exc:
        return str(exc)
    return "accepted"


def test_a_parameter_adamw_never_stepped_is_named_in_the_refusal():
    message = run_workers(_unused_parameter, 2, (), timeout_s=60)[0]
    assert "parameter 'spare.weight' has no AdamW moments" in message and "requires_grad=False" in message
