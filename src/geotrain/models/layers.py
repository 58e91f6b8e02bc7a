"""The stage-model contract: an ordered list of layers that a pipeline cuts into contiguous stages.

    hidden = layers[0](token_ids)      # int64 (B, T) -> activations
    hidden = layers[i](hidden)         # one tensor in, one tensor out
    logits = layers[-1](hidden)        # (B, T, vocab_size)
    loss = lm_loss(logits, targets)    # the one loss every adapter and the runtime share

Stage s of a split with boundaries (0 = b_0 < b_1 < ... < b_S = len(layers)) is
nn.Sequential(layers[b_s:b_{s+1}]): composing the stages in order is the unsplit model, exactly.
A parameter object held by two layers (GPT-2's wte and lm_head) is a tied weight; when its layers
fall in different stages the runtime must sum its gradient between those stages (see models/tied.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from geotrain.errors import GeotrainError


class LayerModelError(GeotrainError, ValueError):
    """A layer list, a split or a stage index does not fit the model."""


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats of logits (..., vocab) against int64 targets (...)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


@dataclass(frozen=True)
class TiedWeight:
    """One parameter shared by several layers: `places` lists (layer index, parameter name inside the layer)."""

    places: tuple[tuple[int, str], ...]

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(layer for layer, _ in self.places)


def find_tied_weights(layers: Sequence[nn.Module]) -> tuple[TiedWeight, ...]:
    """Parameters that appear (as the same object) in more than one layer, in order of first appearance."""
    places: dict[int, list[tuple[int, str]]] = {}
    for index, layer in enumerate(layers):
        for name, param in layer.named_parameters(remove_duplicate=True):
            places.setdefault(id(param), []).append((index, name))
    return tuple(TiedWeight(tuple(found)) for found in places.values()
                 if len({layer for layer, _ in found}) > 1)


def check_boundaries(boundaries: Sequence[int], n_layers: int) -> tuple[int, ...]:
    """`boundaries` as a tuple, after checking 0 = b_0 < b_1 < ... < b_S = n_layers."""
    cuts = tuple(int(b) for b in boundaries)
    if len(cuts) < 2 or cuts[0] != 0 or cuts[-1] != n_layers or any(a >= b for a, b in zip(cuts, cuts[1:])):
        raise LayerModelError(f"stage boundaries must rise strictly from 0 to {n_layers} (every stage non-empty), "
                              f"got {list(cuts)[:12]}")
    return cuts


def even_boundaries(n_layers: int, stages: int) -> tuple[int, ...]:
    """Equal layer counts per stage (earlier stages take the remainder)."""
    if not 1 <= stages <= n_layers:
        raise LayerModelError(f"cannot cut {n_layers} layers into {stages} stages (need 1 <= stages <= layers)")
    base, extra = divmod(n_layers, stages)
    cuts = [0]
    for stage in range(stages):
        cuts.append(cuts[-1] + base + (1 if stage < extra else 0))
    return tuple(cuts)


@dataclass(frozen=True, eq=False)
class LayerModel:
    """A model as an ordered layer list plus what a runtime needs to know about it.

    `vocab_size` is None when it cannot be told (a user model without embedding/linear ends);
    `context` is the longest sequence in tokens, None when unlimited or unknown;
    `hidden_size` is the width of the activations crossing a cut, None when unknown.
    """

    name: str
    layers: tuple[nn.Module, ...]
    vocab_size: int | None = None
    context: int | None = None
    hidden_size: int | None = None

    def __post_init__(self) -> None:
        if not self.layers:
            raise LayerModelError(f"model {self.name!r}: the layer list is empty")
        for index, layer in enumerate(self.layers):
            if not isinstance(layer, nn.Module):
                raise LayerModelError(f"model {self.name!r}: layer {index} is a {type(layer).__name__}, "
                                      "not a torch.nn.Module")

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def tied_weights(self) -> tuple[TiedWeight, ...]:
        return find_tied_weights(self.layers)

    def layer_parameter_counts(self) -> np.ndarray:
        """Parameters held by each layer (int64, shape (n_layers,)); a tied weight counts in every layer holding it."""
        return np.array([sum(p.numel() for p in layer.parameters()) for layer in self.layers], dtype=np.int64)

    def num_parameters(self) -> int:
        """Distinct parameters of the whole model (a tied weight counted once)."""
        return sum(p.numel() for p in self.as_module().parameters())

    def as_module(self) -> nn.Sequential:
        """The unsplit model: all layers in one nn.Sequential (shares the layers' parameters)."""
        return nn.Sequential(*self.layers)

    def stage_module(self, boundaries: Sequence[int], stage: int) -> nn.Sequential:
        """Layers [b_stage, b_stage+1) as one nn.Sequential sharing the model's parameters."""
        cuts = check_boundaries(boundaries, self.n_layers)
        if not 0 <= stage < len(cuts) - 1:
            raise LayerModelError(f"stage {stage} outside 0..{len(cuts) - 2}")
        return nn.Sequential(*self.layers[cuts[stage]:cuts[stage + 1]])

    def stage_modules(self, boundaries: Sequence[int]) -> list[nn.Sequential]:
        """Every stage in order; running them in sequence is the unsplit forward."""
        cuts = check_boundaries(boundaries, self.n_layers)
        return [self.stage_module(cuts, stage) for stage in range(len(cuts) - 1)]

    def stage_io_shapes(self, boundaries: Sequence[int], batch: int, seq_len: int
                        ) -> list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]:
        """(input shape, output shape, output dtype) of each stage for `batch` sequences of `seq_len` tokens.

        Found by running the model once on zeros under no_grad (what pipelining needs up front).
        """
        cuts = check_boundaries(boundaries, self.n_layers)
        hidden = torch.zeros(batch, seq_len, dtype=torch.long, device=_device_of(self.layers))
        shapes = []
        with torch.no_grad():
            for stage in range(len(cuts) - 1):
                inputs = hidden
                for layer in self.layers[cuts[stage]:cuts[stage + 1]]:
                    hidden = layer(hidden)
                shapes.append((tuple(inputs.shape), tuple(hidden.shape), hidden.dtype))
        return shapes


def _device_of(layers: Sequence[nn.Module]) -> torch.device:
    for layer in layers:
        for param in layer.parameters():
            return param.device
    return torch.device("cpu")


def run_layers(modules: Sequence[nn.Module], inputs: torch.Tensor) -> torch.Tensor:
    """Run stages (or layers) in sequence: what a pipeline computes, in one process."""
    hidden = inputs
    for module in modules:
        hidden = module(hidden)
    return hidden
