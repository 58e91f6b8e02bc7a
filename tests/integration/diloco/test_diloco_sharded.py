"""`DiLoCo` on FSDP2 (DTensor) parameters in real gloo processes: 2 sites x 2 shards (a (replicate, shard) mesh,
`fully_shard` on the shard dimension, DiLoCo on the replicate group) against the unsharded 2-site run of the same
model and data in float64, blocking, with adaptive local steps and with moment sync (AdamW); the same loop with
int8-block, 2 fragments and delay 1 ends with every shard equal to its peer and the loss down, and so does the loop
with asynchronous updates (a server per shard position); a group of one site's shards, regions and fragments cut by
bytes are refused. With regions (4 sites x 2 shards in 2 regions), the sharded run equals the unsharded one too.

Tolerance (float64, machine epsilon eps = 2.2e-16). The runs differ only in how a step's gradient is summed: FSDP
reduce-scatters the mean of the two shards' micro-batch gradients, the unsharded rank sums the concatenated batch
at once. Each element is a sum of 2B = 16 per-sample terms of size <= G (the largest gradient element, measured),
whose recursive summation is off by at most 2B eps G (Higham, 2002, 4.2); twice, one run against the other: 4B
eps G per inner step. SGD (lr 0.05) turns it into 0.05 x 4B eps G of the parameters per step, and T = 12 inner
steps at most add them up; the MLP's gradient moves by at most L x the parameters' change per step with
lr x L < 1 here, and the outer Nesterov step (0.7, 0.9) scales an outer gradient by at most 0.7 x 1.9 / 0.1 =
13.3 over the run: tol = 13.3 x 2 x T x 0.05 x 4B eps G (the factor 2 for the gradient's feedback). The anchors
and the exchange are fp32 in both runs (OuterStep): equal inputs round equal, and an input 1e-15 apart flips a
rounding with probability ~1e-8 per element per sync (2 ulp32 would then show).

With moment sync the inner optimizer is AdamW (lr 0.01, eps 1e-8) and the moments travel (fp32) at every outer
sync. A gradient element off by d moves the first moment m_hat by at most d (its weights sum to 1) and sqrt(v_hat)
by at most d (a weighted 2-norm of the gradients: the triangle inequality), so the step m_hat / (sqrt(v_hat) + eps)
moves by at most d (1 + U) / eps, U = ADAM_STEP_MAX: tol = 13.3 x 2 x T x 0.01 x (1 + U) x 4B eps G / 1e-8
(8e-6 here; measured: 0, bit-identical weights, and the weights move 0.2)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from geotrain.comm import run_workers
from geotrain.diloco import DiLoCo

H, PERIODS, B, LR = 4, 3, 8, 0.05
ADAM_LR, ADAM_EPS = 0.01, 1e-8
"""The inner AdamW's lr and epsilon with moment sync (its betas: torch's, 0.9 and 0.999)."""
ADAM_STEP_MAX = 1.07
"""A bound on |m_hat| / sqrt(v_hat) over 12 AdamW steps of betas (0.9, 0.999): by Cauchy-Schwarz on the two
moments' weights, sqrt(sum_i a_i^2 / b_i) <= 1.062 (t = 12; 1 at t = 1); averaging replicas' moments keeps it
(|mean m| <= mean(U sqrt v) <= U sqrt(mean v))."""
"""Inner steps per period, periods, a site's batch per inner step (each shard: B / 2), the inner SGD's lr."""
SHARD_STEP_S = ((0.01, 0.01), (0.02, 0.04))
"""Adaptive: the step seconds each (site, shard) measures. Shard 0's peers alone would share 8 steps 5 : 3 (1 : 2),
shard 1's 6 : 2 (1 : 4), and FSDP's collectives inside site 1 would not match; the site agrees on its slowest
shard's (0.04), as the unsharded run's site measures it: 6 : 2 from period 3 on."""


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()


def _batch(site: int, step: int) -> torch.Tensor:
    return torch.randn(B, 8, generator=torch.Generator().manual_seed(1000 * site + step), dtype=torch.float64)


def _loss(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), x[:, :1] - 0.5 * x[:, 1:2])


def _run(model: torch.nn.Module, site: int, rows: slice, group, mode: str, step_s: float) -> dict:
    """One DiLoCo loop of `mode` ("blocking", "adaptive", "streaming"; "<mode>-host": with outer_state "host") on
    `rows` of each site batch; adaptive: each inner step 'takes' `step_s` (the first two periods are shared 5 : 3 by a
    prior)."""
    mode, _, host = mode.partition("-")
    inner = (torch.optim.AdamW(model.parameters(), lr=ADAM_LR, eps=ADAM_EPS) if mode == "moments"
             else torch.optim.SGD(model.parameters(), lr=LR))
    options = {"blocking": {"codec": "none"}, "moments": {"codec": "none", "sync_moments": True},
               "adaptive": {"codec": "none", "local_steps": "adaptive", "prior_step_s": [1.0, 2.0],
                            "step_time": lambda: step_s},
               "streaming": {"codec": "int8-block", "fragments": 2, "delay": 1},
               "eager": {"codec": "int8-block", "fragments": 2, "delay": 1, "landing": "eager"}}[mode]
    options = {**options, **({"outer_state": "host"} if host else {})}
    losses, grad_max = [], 0.0
    with DiLoCo(model, inner, sync_every=H, group=group, **options) as diloco:
        while diloco.outer_step < PERIODS:
            x = _batch(site, diloco.inner_steps)[rows]
            inner.zero_grad()
            loss = _loss(model, x)
            loss.backward()
            losses.append(float(loss.detach()))
            grad_max = max(grad_max, max(float(_local(p.grad).abs().max()) for p in model.parameters()
                                         if _local(p.grad).numel()))
            inner.step()
    outers = [f.outer for f in diloco.sync.fragments] if mode != "adaptive" else [diloco.sync.outer]
    moments = [t for p in model.parameters() for t in (inner.state[p]["exp_avg"], inner.state[p]["exp_avg_sq"])
               ] if mode == "moments" else []
    state = [e.state_dict() for e in diloco.exchanges]
    return {"params": [_local(p).clone() for p in model.parameters()], "losses": losses,
            "inner_steps": diloco.inner_steps, "grad_max": grad_max, "fingerprint": diloco.fingerprint(),
            "anchor_elements": sum(a.numel() for o in outers for a in o.anchor),
            "residual_elements": sum(t.numel() for s in state for t in _tensors(s)),
            "moments": [_local(t).clone() for t in moments]}


def _tensors(state) -> list[torch.Tensor]:
    """Every tensor in a (nested) state dict: the codec's residuals."""
    if isinstance(state, torch.Tensor):
        return [state]
    values = state.values() if isinstance(state, dict) else state if isinstance(state, list | tuple) else []
    return [t for v in values for t in _tensors(v)]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local().detach() if hasattr(t, "to_local") else t.detach()


def _sharded_model(mesh) -> torch.nn.Module:
    """_model() with each Linear and the whole model fully_shard-ed on the mesh's shard dimension (FSDP2)."""
    from torch.distributed.fsdp import fully_shard

    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    return model


def _sharded(rank: int, world: int, modes: tuple[str, ...]) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    site, shard = mesh["replicate"].get_local_rank(), mesh["shard"].get_local_rank()
    out = {"site": site, "shard": shard}
    for mode in modes:
        model = _sharded_model(mesh)
        half = B // 2
        out[mode] = _run(model, site, slice(shard * half, (shard + 1) * half), mesh["replicate"].get_group(), mode,
                         SHARD_STEP_S[site][shard])
    out["asynchronous"] = _run_async(site, shard, mesh)
    refused = {"group": {"group": mesh["shard"].get_group()},  # one site's shards, not same-shard peers
               "bytes": {"fragments": 2, "fragment_split": "bytes", "group": mesh["replicate"].get_group()},
               "async-regions": {"asynchronous": True, "codec": "none", "group": mesh["replicate"].get_group(),
                                 "regions": [[0, 1], [2, 3]]}}
    out["refusals"] = {}
    for key, options in refused.items():
        try:
            DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=LR), sync_every=H, **options)
            out["refusals"][key] = "accepted"
        except Exception as exc:  # noqa: BLE001 - the test reads the type and message
            out["refusals"][key] = f"{type(exc).__name__}: {exc}"
    return out


def _run_async(site: int, shard: int, mesh) -> dict:
    """Asynchronous outer updates (outer lr 1, no momentum) on the shards: a global model's server per shard
    position (on site 0's rank of it); each site's shards step as one and agree on their update count."""
    model = _sharded_model(mesh)
    inner = torch.optim.SGD(model.parameters(), lr=LR)
    half, losses = B // 2, []
    seen = [_batch(site, i)[slice(shard * half, (shard + 1) * half)] for i in range(H)]  # the first period's batches

    def seen_loss() -> float:  # the model's mean loss on them (a fixed set: the per-step losses are too noisy)
        with torch.no_grad():
            return sum(float(_loss(model, x)) for x in seen) / len(seen)

    before = seen_loss()
    with DiLoCo(model, inner, sync_every=H, group=mesh["replicate"].get_group(), asynchronous=True, codec="none",
                outer_lr=1.0, outer_momentum=0.0) as diloco:
        while diloco.outer_step < 2 * PERIODS:  # replica outer gradients in the global model this rank holds
            x = _batch(site, diloco.inner_steps)[slice(shard * half, (shard + 1) * half)]
            inner.zero_grad()
            loss = _loss(model, x)
            loss.backward()
            losses.append(float(loss.detach()))
            inner.step()
    return {"params": [_local(p).clone() for p in model.parameters()], "losses": losses,
            "anchor_elements": diloco.asynchronous.anchor.numel(), "seen_loss": (before, seen_loss())}


REGIONS = [[0, 1], [2, 3]]
"""4 sites in 2 regions (site indices: ranks of the replicate group)."""


def _regions_run(model: torch.nn.Module, site: int, rows: slice, group) -> dict:
    """Blocking DiLoCo with REGIONS: the region's sites average each inner step's gradient, the outer sync goes
    through the hierarchical exchange (fp32: codec none)."""
    inner = torch.optim.SGD(model.parameters(), lr=LR)
    grad_max = 0.0
    with DiLoCo(model, inner, sync_every=H, group=group, regions=REGIONS, codec="none") as diloco:
        while diloco.outer_step < PERIODS:
            x = _batch(site, diloco.inner_steps)[rows]
            inner.zero_grad()
            _loss(model, x).backward()
            grad_max = max(grad_max, max(float(_local(p.grad).abs().max()) for p in model.parameters()
                                         if _local(p.grad).numel()))
            inner.step()
    return {"params": [_local(p).clone() for p in model.parameters()], "grad_max": grad_max,
            "inner_steps": diloco.inner_steps, "region_bytes": diloco.region_bytes}


def _sharded_regions(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("replicate", "shard"))
    site, shard = mesh["replicate"].get_local_rank(), mesh["shard"].get_local_rank()
    model = _sharded_model(mesh)
    half = B // 2
    return {"site": site, "shard": shard,
            **_regions_run(model, site, slice(shard * half, (shard + 1) * half), mesh["replicate"].get_group())}


def _unsharded_regions(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    return _regions_run(_model(), rank, slice(0, B), None)


def _unsharded(rank: int, world: int, modes: tuple[str, ...]) -> dict:
    torch.set_num_threads(1)
    return {mode: _run(_model(), rank, slice(0, B), None, mode, max(SHARD_STEP_S[rank])) for mode in modes}


def _shard_of(full: torch.Tensor, shard: int) -> torch.Tensor:
    """FSDP2's dim-0 chunk `shard` of 2 (ceil-sized; the last may be shorter)."""
    rows = -(-full.shape[0] // 2)
    return full[shard * rows:(shard + 1) * rows]


@pytest.fixture(scope="module")
def runs():
    modes = ("blocking", "adaptive", "moments", "streaming")
    hosted = tuple(f"{mode}-host" for mode in (*modes, "eager")) + ("eager",)
    return (run_workers(_sharded, 4, (modes + hosted,), timeout_s=240),
            run_workers(_unsharded, 2, (modes[:3] + hosted[:3],), timeout_s=120))


def test_with_moment_sync_a_sharded_run_equals_the_unsharded_run_in_float64(runs):
    """AdamW inner steps with sync_moments: the moments of a DTensor parameter are DTensors, each shard's averaged
    with its peer's at every outer sync (module doc: the tolerance)."""
    sharded, unsharded = runs
    grad_max = max(r["moments"]["grad_max"] for r in unsharded)
    steps = max(r["moments"]["inner_steps"] for r in unsharded)
    gradient_error = 4 * B * torch.finfo(torch.float64).eps * grad_max
    tol = 13.3 * 2 * steps * ADAM_LR * (1 + ADAM_STEP_MAX) * gradient_error / ADAM_EPS
    worst = 0.0
    for r in sharded:
        expected = [_shard_of(p, r["shard"]) for p in unsharded[r["site"]]["moments"]["params"]]
        for got, want in zip(r["moments"]["params"], expected, strict=True):
            worst = max(worst, float((got - want).abs().max()) if got.numel() else 0.0)
        expected = [_shard_of(m, r["shard"]) for m in unsharded[r["site"]]["moments"]["moments"]]
        assert [m.shape for m in r["moments"]["moments"]] == [m.shape for m in expected]  # local shards
    assert worst <= tol, (worst, tol)
    moved = max(float((a - b).abs().max()) for a, b in zip(unsharded[0]["moments"]["params"],
                                                             [p.detach() for p in _model().parameters()]))
    assert moved > 1e4 * tol  # the check can fail: training moved the weights far beyond it
    for shard in (0, 1):  # the last sync (on leaving the block) averaged the moments: each shard's equal its peer's
        first, second = (r["moments"]["moments"] for r in sharded if r["shard"] == shard)
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("mode", ["blocking", "adaptive"])
def test_a_sharded_run_equals_the_unsharded_run_in_float64(runs, mode):
    sharded, unsharded = runs
    grad_max = max(r[mode]["grad_max"] for r in unsharded)
    steps = max(r[mode]["inner_steps"] for r in unsharded)
    tol = 13.3 * 2 * steps * LR * 4 * B * torch.finfo(torch.float64).eps * grad_max
    worst = 0.0
    for r in sharded:
        expected = [_shard_of(p, r["shard"]) for p in unsharded[r["site"]][mode]["params"]]
        for got, want in zip(r[mode]["params"], expected, strict=True):
            assert got.shape == want.shape  # a local shard, not the full tensor
            worst = max(worst, float((got - want).abs().max()) if got.numel() else 0.0)
    assert worst <= tol, (worst, tol)
    moved = max(float((a - b).abs().max()) for a, b in zip(unsharded[0][mode]["params"],
                                                             [p.detach() for p in _model().parameters()]))
    assert moved > 1e6 * tol  # the check can fail: training moved the weights far beyond it
    if mode == "adaptive":  # 5 : 3 steps in periods 1-2 (the prior), 6 : 2 in period 3, each site's shards alike
        assert [r[mode]["inner_steps"] for r in sharded] == [16, 16, 8, 8]


def test_int8_fragments_and_delay_end_with_every_shard_equal_to_its_peer_and_the_loss_down(runs):
    sharded, _ = runs
    full = sum(p.numel() for p in _model().parameters())
    for r in sharded:  # anchors and error-feedback residuals hold this rank's shard, not the model
        local = sum(p.numel() for p in r["streaming"]["params"])
        assert local < 0.6 * full and r["streaming"]["anchor_elements"] == local
        assert 0 < r["streaming"]["residual_elements"] <= local
    by_shard = {s: [r for r in sharded if r["shard"] == s] for s in (0, 1)}
    for peers in by_shard.values():
        for a, b in zip(peers[0]["streaming"]["params"], peers[1]["streaming"]["params"], strict=True):
            assert torch.equal(a, b)
    for r in sharded:
        losses = r["streaming"]["losses"]
        assert sum(losses[-H:]) / H < 0.8 * sum(losses[:H]) / H, losses


def test_what_the_sync_cannot_serve_on_shards_is_refused_in_one_line(runs):
    sharded, _ = runs
    refusals = sharded[0]["refusals"]
    assert all(m.startswith("SyncError: DiLoCo") and "\n" not in m for m in refusals.values()), refusals
    assert "mesh['replicate'].get_group()" in refusals["group"]
    assert "not with fragment_split 'bytes'" in refusals["bytes"]
    assert "asynchronous regions are not built here" in refusals["async-regions"]


def test_asynchronous_updates_serve_each_shard_position_and_every_rank_ends_on_its_positions_global_model(runs):
    """Each shard position's server (site 0's rank of it) holds its shard of the global model; on leaving the block
    every rank holds its position's final model (a shard equals its peer), the anchor is the local shard's size, and
    the loss falls."""
    sharded, _ = runs
    full = sum(p.numel() for p in _model().parameters())
    for shard in (0, 1):
        first, second = (r["asynchronous"] for r in sharded if r["shard"] == shard)
        assert all(torch.equal(a, b) for a, b in zip(first["params"], second["params"], strict=True))
    for r in sharded:
        run = r["asynchronous"]
        assert run["anchor_elements"] == sum(p.numel() for p in run["params"]) < 0.6 * full
        before, after = run["seen_loss"]  # the final global model against the first on the first period's batches
        assert after < before, (run["seen_loss"], run["losses"])


def test_with_regions_a_sharded_run_equals_the_unsharded_run_in_float64():
    """4 sites x 2 shards, REGIONS as ranks of the replicate group: each shard position averages its gradients over
    the same shard of its region's sites every inner step and syncs through the hierarchical exchange per shard; the
    weights are the unsharded 4-site run's within the blocking tolerance (module doc), with one more rounding of the
    region's mean per step (+ 2 eps G)."""
    sharded = run_workers(_sharded_regions, 8, (), timeout_s=240)
    unsharded = run_workers(_unsharded_regions, 4, (), timeout_s=120)
    grad_max = max(r["grad_max"] for r in unsharded)
    steps = max(r["inner_steps"] for r in unsharded)
    tol = 13.3 * 2 * steps * LR * (4 * B + 2) * torch.finfo(torch.float64).eps * grad_max
    worst = 0.0
    for r in sharded:
        expected = [_shard_of(p, r["shard"]) for p in unsharded[r["site"]]["params"]]
        for got, want in zip(r["params"], expected, strict=True):
            assert got.shape == want.shape
            worst = max(worst, float((got - want).abs().max()) if got.numel() else 0.0)
        assert r["region_bytes"] > 0  # the region's every-step mean ran on this shard
    assert worst <= tol, (worst, tol)
    moved = max(float((a - b).abs().max()) for a, b in zip(unsharded[0]["params"],
                                                             [p.detach() for p in _model().parameters()]))
    assert moved > 1e6 * tol  # the check can fail: training moved the weights far beyond it
    # sites of one region end equal, the regions' too after the last outer sync (each shard against its peers)
    for shard in (0, 1):
        peers = [r["params"] for r in sharded if r["shard"] == shard]
        assert all(torch.equal(a, b) for other in peers[1:] for a, b in zip(peers[0], other, strict=True))


def test_outer_state_in_host_memory_gives_bit_identical_parameters_in_every_mode(runs):
    """outer_state "host" (geotrain.optim.outer_state) moves where the anchors, outer momentum and exchanged outer
    gradients live, not what is computed: after every mode's outer syncs (blocking, adaptive, moment sync with
    AdamW, int8-block with 2 fragments and delay 1 under the mix and the eager landing; on FSDP2 shards and on plain
    parameters) the parameters, the moments and the anchors' fingerprint are bit for bit those of "device"."""
    sharded, unsharded = runs
    compared = 0
    for r in [*sharded, *unsharded]:
        for mode in ("blocking", "adaptive", "moments", "streaming", "eager"):
            if f"{mode}-host" not in r:
                continue
            device, host = r[mode], r[f"{mode}-host"]
            assert host["inner_steps"] == device["inner_steps"] and host["losses"] == device["losses"]
            assert all(torch.equal(a, b) for a, b in zip(host["params"], device["params"], strict=True)), mode
            assert all(torch.equal(a, b) for a, b in zip(host["moments"], device["moments"], strict=True)), mode
            assert host["fingerprint"] == device["fingerprint"]
            compared += 1
    assert compared == 4 * 5 + 2 * 3
