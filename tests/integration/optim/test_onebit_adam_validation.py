"""OneBitAdam refuses bad hyper-parameters and non-finite gradients (state untouched, parameter named)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.codecs import NonFiniteGradientError
from geotrain.errors import GeotrainError
from geotrain.comm import SimulatedCollective
from geotrain.optim import OneBitAdam, OneBitAdamError, OneBitAdamRuleFactory


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _grads(opt: OneBitAdam, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(opt.layout.numel, generator=generator) for _ in opt.collective.local_ranks]


def _snapshot(opt: OneBitAdam, model: torch.nn.Module) -> list[torch.Tensor | int]:
    """Everything a step may change: the state dict's tensors and numbers, and the parameters."""
    onebit = opt.state_dict()["onebit"]
    tensors = [onebit["exp_avg"], onebit["exp_avg_sq"], *onebit["worker_errors"], *onebit["server_errors"]]
    return [onebit["step_count"], *(t.clone() for t in tensors), *(p.detach().clone() for p in model.parameters())]


def _same_bits(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        (x == y) if isinstance(x, int) else
        (x.shape == y.shape and torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)))
        for x, y in zip(a, b, strict=True))


BAD_ARGUMENTS = [
    ({"lr": math.nan}, r"lr must be a finite number in \[0, inf\], got nan"),
    ({"lr": math.inf}, r"lr must be a finite number"),
    ({"lr": -1e-3}, r"lr must be a finite number in \[0, inf\], got -0.001"),
    ({"lr": "0.1"}, r"lr must be a finite number"),
    ({"eps": math.nan}, r"eps must be a finite number in \(0, inf\]"),
    ({"eps": 0.0}, r"eps must be a finite number in \(0, inf\], got 0.0"),
    ({"eps": -1e-8}, r"eps must be"),
    ({"weight_decay": math.inf}, r"weight_decay must be"),
    ({"max_grad_norm": math.nan}, r"max_grad_norm \(or None: no clipping\) must be a finite number in \(0, inf\]"),
    ({"max_grad_norm": math.inf}, r"max_grad_norm"),
    ({"max_grad_norm": -1.0}, r"max_grad_norm"),
    ({"max_grad_norm": 0.0}, r"max_grad_norm"),
    ({"warmup_steps": 1.5}, r"warmup_steps .*must be an integer >= 1, got 1.5"),
    ({"warmup_steps": 2.0}, r"warmup_steps .*got 2.0"),
    ({"warmup_steps": "3"}, r"warmup_steps .*got '3'"),
    ({"warmup_steps": True}, r"warmup_steps"),
    ({"warmup_steps": 0}, r"warmup_steps"),
    ({"betas": (0.9,)}, r"betas must be two numbers \(beta1, beta2\), got \(0.9,\)"),
    ({"betas": (0.9, 0.99, 0.999)}, r"betas must be two numbers"),
    ({"betas": 0.9}, r"betas must be two numbers"),
    ({"betas": (1.0, 0.999)}, r"betas\[0\] must be a finite number in \[0, 1\), got 1.0"),
    ({"betas": (0.9, -0.1)}, r"betas\[1\]"),
    ({"betas": (0.9, math.nan)}, r"betas\[1\]"),
    ({"variance_floor": 1.5}, r"variance_floor must be a finite number in \[0, 1\]"),
    ({"variance_floor": math.nan}, r"variance_floor"),
    ({"clip_local": "maybe"}, r"clip_local must be a boolean"),
    ({"allow_nonfinite": 2}, r"allow_nonfinite must be a boolean"),
    ({"collective": 4}, r"collective must be a Collective .*got int"),
]


@pytest.mark.parametrize("kwargs,message", BAD_ARGUMENTS, ids=[str(k) for k, _ in BAD_ARGUMENTS])
def test_every_bad_hyperparameter_is_refused_naming_it(kwargs, message):
    with pytest.raises(OneBitAdamError, match=message) as info:
        OneBitAdam(_model().parameters(), **kwargs)
    assert isinstance(info.value, GeotrainError) and isinstance(info.value, ValueError)


def test_bad_options_of_one_param_group_and_empty_params_are_refused():
    model = _model()
    with pytest.raises(OneBitAdamError, match=r"param_groups\[1\]\.lr must be a finite number"):
        OneBitAdam([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": math.nan}])
    with pytest.raises(OneBitAdamError, match="params: optimizer got an empty parameter list"):
        OneBitAdam([])
    with pytest.raises(OneBitAdamError, match="every parameter needs at least one value"):
        OneBitAdam([torch.nn.Parameter(torch.empty(0))])


def test_rule_factory_checks_its_options_and_the_lr_it_sets():
    from geotrain.sim import TrainConfig

    with pytest.raises(OneBitAdamError, match="warmup_fraction must be a finite number in"):
        OneBitAdamRuleFactory(warmup_fraction=math.nan)
    with pytest.raises(OneBitAdamError, match=r"warmup_steps .*must be an integer >= 1, got 1.5"):
        OneBitAdamRuleFactory(warmup_steps=1.5)
    rule = OneBitAdamRuleFactory(warmup_steps=2)(_model(), TrainConfig(workers=2))
    with pytest.raises(OneBitAdamError, match=r"lr \(set by the training loop's schedule\) must be a finite number"):
        rule.step(_grads(rule.optimizer, 0), math.inf, 0)


@pytest.mark.parametrize("stage", ["warm-up", "compression"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_one_workers_non_finite_gradient_is_refused_naming_the_parameter_and_state_is_unchanged(stage, bad):
    model = _model()
    opt = OneBitAdam(model.named_parameters(), lr=1e-2, warmup_steps=2, collective=SimulatedCollective(4))
    for seed in range(3 if stage == "compression" else 1):  # 3 steps: frozen after 2
        opt.step_workers(_grads(opt, seed))
    assert opt.frozen == (stage == "compression")
    before = _snapshot(opt, model)
    grads = _grads(opt, 99)
    grads[2][model[0].weight.numel() + 1] = bad  # worker 2, parameter "0.bias"
    message = r"in parameter\(s\) 0\.bias; non-finite gradient from local worker\(s\) \[2\]\. Step refused, " \
              r"optimizer state unchanged"
    with pytest.raises(NonFiniteGradientError, match=message):
        opt.step_workers(grads)
    assert _same_bits(before, _snapshot(opt, model))
    # The next finite step runs as if the refused one never happened.
    twin = _model()
    twin_opt = OneBitAdam(twin.named_parameters(), lr=1e-2, warmup_steps=2, collective=SimulatedCollective(4))
    twin_opt.load_state_dict(opt.state_dict())
    twin.load_state_dict(model.state_dict())
    opt.step_workers(_grads(opt, 5))
    twin_opt.step_workers(_grads(twin_opt, 5))
    assert _same_bits(_snapshot(opt, model), _snapshot(twin_opt, twin))


def test_unnamed_parameters_are_named_by_index_and_shape_and_allow_nonfinite_lets_nan_through():
    model = _model()
    opt = OneBitAdam(model.parameters(), warmup_steps=1)
    grads = _grads(opt, 0)
    grads[0][-1] = math.nan  # last value: the second Linear's bias, parameter #3
    with pytest.raises(NonFiniteGradientError, match=r"parameter\(s\) #3 \(3,\)"):
        opt.step_workers(grads)
    lenient = OneBitAdam(_model().parameters(), warmup_steps=1, allow_nonfinite=True)
    lenient.step_workers(grads)
    assert torch.isnan(lenient.exp_avg).any()  # the old behaviour, on request


@settings(max_examples=25, deadline=None)
@given(lr=st.floats(allow_nan=True, allow_infinity=True), eps=st.floats(allow_nan=True, allow_infinity=True),
       warmup=st.one_of(st.integers(-3, 5), st.floats(-2, 5)), beta=st.floats(-1, 2))
def test_construction_either_succeeds_with_valid_values_or_raises_one_bit_adam_error(lr, eps, warmup, beta):
    valid = (math.isfinite(lr) and lr >= 0 and math.isfinite(eps) and eps > 0 and isinstance(warmup, int)
             and warmup >= 1 and 0 <= beta < 1)
    try:
        OneBitAdam(_model().parameters(), lr=lr, eps=eps, warmup_steps=warmup, betas=(beta, 0.999))
    except OneBitAdamError:
        assert not valid
    else:
        assert valid


def _nan_on_one_rank(rank: int, world_size: int, stage_steps: int) -> dict:
    """`stage_steps` finite steps, then one where only rank 1's gradient holds a NaN, then a finite one."""
    from geotrain.comm import TorchCollective

    model = _model()
    opt = OneBitAdam(model.named_parameters(), lr=1e-2, warmup_steps=2, collective=TorchCollective())
    for seed in range(stage_steps):
        opt.step_workers([_grads(opt, 10 * seed + rank)[0]])
    before = _snapshot(opt, model)
    grad = _grads(opt, 77 + rank)[0]
    if rank == 1:
        grad[-2] = math.nan  # parameter "2.bias"
    try:
        opt.step_workers([grad])
        refused = ""
    except NonFiniteGradientError as error:
        refused = str(error)
    unchanged = _same_bits(before, _snapshot(opt, model))
    opt.step_workers([_grads(opt, 88 + rank)[0]])  # no rank hangs: the next step runs on all of them
    return {"refused": refused, "unchanged": unchanged, "momentum": opt.exp_avg.clone(), "step": opt.step_count}


@pytest.mark.slow
@pytest.mark.parametrize("stage_steps", [1, 3], ids=["warm-up", "compression"])
def test_every_rank_refuses_the_same_step_when_one_rank_sends_nan(stage_steps):
    from geotrain.comm import run_workers

    results = run_workers(_nan_on_one_rank, 2, (stage_steps,), timeout_s=120)
    for rank, result in enumerate(results):
        assert "in parameter(s) 2.bias" in result["refused"] and result["unchanged"]
        assert ("local worker(s) [1]" in result["refused"]) == (rank == 1)
        assert ("another rank sent NaN/inf" in result["refused"]) == (rank == 0)
        assert result["step"] == stage_steps + 1
    assert torch.equal(results[0]["momentum"], results[1]["momentum"])  # still in sync after the refusal


def test_a_saved_state_with_wrong_sizes_or_counts_is_refused_before_loading():
    model = _model()
    opt = OneBitAdam(model.parameters(), warmup_steps=1, collective=SimulatedCollective(2))
    opt.step_workers(_grads(opt, 0))
    good = opt.state_dict()
    for key, value in (("worker_errors", [torch.zeros(3), torch.zeros(3)]), ("server_errors", []),
                       ("exp_avg_sq", torch.zeros(2)), ("step_count", 1.5), ("warmup_steps", "2")):
        bad = {**good, "onebit": {**good["onebit"], key: value}}
        target = OneBitAdam(_model().parameters(), warmup_steps=1, collective=SimulatedCollective(2))
        before = _snapshot(target, model)
        with pytest.raises(OneBitAdamError, match="OneBitAdam state"):
            target.load_state_dict(bad)
        assert _same_bits(before, _snapshot(target, model))
