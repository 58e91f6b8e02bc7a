"""Pipeline stages of any LayerModel: which model, where it is cut, what a stage sends.

Every worker builds the whole model from the same seed (so all replicas start identical and the
stages composed are exactly the unsplit model) and keeps the modules of its virtual stages. The
split rule cuts the layer list into S x V contiguous stages: "layers" (equal layer counts), "params"
(balanced parameter counts) or "time" (balanced measured forward + backward seconds per layer);
with per-stage speeds (--split-by-speed) the same costs are balanced as cost / speed, so a stage on
faster devices takes more layers (models.split.split_layers); a plan's own cut (`geotrain plan
--uneven-split`) is used as it is when it counts this model's layers (see `plan_cut`).
A stage module casts its output to the wire dtype (fp32, or fp16/bf16 with --pp-codec), so that is
what torch's pipelining sends; the next stage computes in fp32 again. With a quantising --pp-codec
(int8-block, int4-block, sign-block...: a `PackedWire`, runtime/cut_wire.py) the stage outputs a
float32 carrier of the codec's packed bytes instead and the next stage decodes it first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Union

import numpy as np
import torch
from torch import nn

from geotrain.models import (
    GPTConfig,
    LayerModel,
    ModelOptions,
    even_boundaries,
    layer_costs,
    load_model_spec,
    make_model,
    split_layers,
)
from geotrain.runtime.cut_wire import PackedWire
from geotrain.runtime.delta_wire import DeltaWire

Wire = Union[torch.dtype, PackedWire, DeltaWire]
"""What crosses one cut: activations cast to a float dtype, or a codec's bytes in a float32 carrier (stateless,
or per-sample deltas)."""
CARRIER_WIRES = (PackedWire, DeltaWire)

SPLIT_RULES = ("layers", "params", "time")


@dataclasses.dataclass(frozen=True)
class StageShapes:
    """Per-micro-batch example shapes of one virtual stage: input (and its dtype), output (and its dtype)."""

    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    output_shape: tuple[int, ...]
    output_dtype: torch.dtype

    def example_input(self, device: torch.device) -> torch.Tensor:
        tensor = torch.zeros(self.input_shape, dtype=self.input_dtype, device=device)
        return tensor.requires_grad_(tensor.is_floating_point())

    def example_output(self, device: torch.device) -> torch.Tensor:
        tensor = torch.zeros(self.output_shape, dtype=self.output_dtype, device=device)
        return tensor.requires_grad_(tensor.is_floating_point())


class StageModule(nn.Module):
    """Layers [a, b) of a model as one pipeline stage: float inputs computed in fp32, the output cast
    to `wire_dtype` unless this is the last stage (logits go to the loss, not to a link). A PackedWire
    `wire_dtype` sends the output as its carrier; a PackedWire `receive` decodes the input carrier into
    activations of `receive_shape` per sample."""

    def __init__(self, layers: Sequence[nn.Module], is_last: bool, wire_dtype: Wire = torch.float32,
                 receive: PackedWire | DeltaWire | None = None, receive_shape: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.layers = nn.Sequential(*layers)
        self.is_last = is_last
        self.wire_dtype = wire_dtype
        self.receive, self.receive_shape = receive, tuple(receive_shape)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.receive is not None:
            inputs = self.receive.receive(inputs, self.receive_shape)
        hidden = inputs.float() if inputs.is_floating_point() else inputs
        hidden = self.layers(hidden)
        if self.is_last:  # fp32 logits under autocast too: what the stage declared to torch's pipelining
            return hidden.float() if hidden.is_floating_point() else hidden
        if isinstance(self.wire_dtype, CARRIER_WIRES):
            return self.wire_dtype.send(hidden)
        return hidden.to(self.wire_dtype)


def tiny_layer_model(config: GPTConfig, seed: int, name: str = "tiny") -> LayerModel:
    """geotrain's TinyGPT of `config` as a layer list [embedding, blocks..., head]."""
    model = make_model(config, seed)
    return LayerModel(name, (model.embed, *model.blocks, model.head), config.vocab_size, config.context,
                      config.d_model)


def build_layer_model(spec: str, presets: dict[str, GPTConfig], seed: int, data_vocab: int | None,
                      seq_len: int | None = None) -> LayerModel:
    """The model of `--model spec`: a TinyGPT preset (its vocabulary and context widened to the data's
    vocabulary and the sequence length), else models.load_model_spec (hf:..., file.py:fn, pkg.mod:fn)."""
    if spec in presets:
        config = presets[spec]
        changes = {}
        if data_vocab is not None and data_vocab != config.vocab_size:
            changes["vocab_size"] = data_vocab
        if seq_len is not None and seq_len > config.context:
            changes["context"] = seq_len
        return tiny_layer_model(dataclasses.replace(config, **changes), seed, spec)
    return load_model_spec(spec, ModelOptions(seed=seed))


def plan_cut(plan_boundaries: Sequence[int], n_layers: int, n_stages: int) -> tuple[int, ...] | None:
    """A plan's cut (S + 1 points over the plan job's layers) in a model of `n_layers` layers: as it is
    when the job counted n_layers layers; shifted by one when it counted n_layers - 2 transformer
    blocks (the model's embedding joins stage 0, its head the last stage). None when there is no plan
    cut, it has another stage count (virtual stages), or another depth: the caller cuts by speed."""
    cuts = tuple(int(b) for b in plan_boundaries)
    if len(cuts) != n_stages + 1:
        return None
    if cuts[-1] == n_layers:
        return cuts
    if cuts[-1] == n_layers - 2:
        return (0, *(b + 1 for b in cuts[1:-1]), n_layers)
    return None


def stage_boundaries(model: LayerModel, n_stages: int, rule: str, seq_len: int,
                     weights: Sequence[float] | None = None, plan_boundaries: Sequence[int] = ()) -> tuple[int, ...]:
    """Cut points (0, b_1, ..., n_layers) of `n_stages` contiguous stages: a plan's cut when it fits
    (`plan_cut`), else by split `rule` with per-stage speeds `weights` (None or all equal: the plain split)."""
    if rule not in SPLIT_RULES:
        raise ValueError(f"split rule must be one of {', '.join(SPLIT_RULES)}, got {rule!r}")
    planned = plan_cut(plan_boundaries, model.n_layers, n_stages)
    if planned is not None:
        return planned
    uniform = weights is None or len(set(weights)) == 1
    if rule == "layers" and uniform:
        return even_boundaries(model.n_layers, n_stages)
    costs = np.ones(model.n_layers) if rule == "layers" else layer_costs(model, rule, batch=2, seq_len=seq_len)
    return split_layers(costs, n_stages, None if uniform else weights)


def cut_dtype(wire_dtype: Wire | Sequence[Wire], cut: int) -> Wire:
    """The wire of cut `cut` (after pipeline stage `cut`): one wire for all cuts, or one per cut."""
    return wire_dtype if isinstance(wire_dtype, (torch.dtype, *CARRIER_WIRES)) else wire_dtype[cut]


def stage_modules(model: LayerModel, boundaries: Sequence[int], wanted: Sequence[int],
                  wire_dtype: Wire | Sequence[Wire] = torch.float32, seq_len: int | None = None
                  ) -> dict[int, StageModule]:
    """Stage index -> StageModule for the stages in `wanted` (sharing the model's parameters);
    `wire_dtype`: one activation wire, or one per cut (stage s sends in wire_dtype[s]). A stage that
    receives a PackedWire decodes samples of the shape the model gives for `seq_len` tokens (needed then)."""
    last = len(boundaries) - 2
    packed_in = [s for s in wanted if s > 0 and isinstance(cut_dtype(wire_dtype, s - 1), CARRIER_WIRES)]
    if packed_in and seq_len is None:
        raise ValueError("stage_modules: a packed activation wire needs seq_len (the shape the receiver decodes)")
    inputs = ({s: found[0][1:] for s, found in enumerate(model.stage_io_shapes(boundaries, 1, seq_len))}
              if packed_in else {})
    modules = {}
    for s in wanted:
        receive = cut_dtype(wire_dtype, s - 1) if s in packed_in else None
        modules[s] = StageModule(model.stage_module(boundaries, s), s == last,
                                 torch.float32 if s == last else cut_dtype(wire_dtype, s), receive,
                                 inputs.get(s, ()))
    return modules


def stage_shapes(model: LayerModel, boundaries: Sequence[int], microbatch: int, seq_len: int,
                 wire_dtype: Wire | Sequence[Wire] = torch.float32, wide: bool = False) -> list[StageShapes]:
    """Per-micro-batch input/output shapes and dtypes of every stage (activations in `wire_dtype`: one
    wire, or one per cut; a PackedWire cut crosses as its float32 carrier; a DeltaWire's carrier is that of
    a `wide` step (first sights) or a narrow one (deltas))."""
    found = model.stage_io_shapes(boundaries, microbatch, seq_len)

    def crossing(shape: tuple[int, ...], cut: int) -> tuple[tuple[int, ...], torch.dtype]:
        wire = cut_dtype(wire_dtype, cut)
        if isinstance(wire, DeltaWire):
            return wire.carrier_shape(shape, wide), torch.float32
        return (wire.carrier_shape(shape), torch.float32) if isinstance(wire, PackedWire) else (shape, wire)

    shapes = []
    for stage, (in_shape, out_shape, out_dtype) in enumerate(found):
        in_dtype = torch.long
        if stage > 0:
            in_shape, in_dtype = crossing(in_shape, stage - 1)
        last = stage == len(found) - 1
        if last:  # the last stage hands floating outputs to the loss in fp32 (StageModule)
            out_dtype = torch.float32 if out_dtype.is_floating_point else out_dtype
        else:
            out_shape, out_dtype = crossing(out_shape, stage)
        shapes.append(StageShapes(in_shape, in_dtype, out_shape, out_dtype))
    return shapes


def build_stage(config: GPTConfig, seed: int, stage: int, stages: int) -> nn.Module:
    """Stage `stage` of `stages` (equal layer split) of the TinyGPT make_model(config, seed) would build."""
    model = tiny_layer_model(config, seed)
    return stage_modules(model, even_boundaries(model.n_layers, stages), [stage])[stage]
