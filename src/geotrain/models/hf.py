"""Hugging Face causal LMs as layer lists (`hf:` specs), built from a config or local weights, never downloaded.

GPT-2: [wte + wpe (+ dropout), block_0, ..., block_{n-1}, ln_f + lm_head];
Llama / Qwen2 / Qwen3 / Mistral: [embed_tokens, decoder_0, ..., decoder_{n-1}, norm + lm_head].
Each block wrapper rebuilds what the HF model computes once per forward (position ids 0..T-1, the
causal or sliding-window mask, the rotary cos/sin) from its input alone, with the same transformers
functions, so running the wrappers in sequence equals model(input_ids).logits exactly (max diff 0).
With `tie_word_embeddings` (GPT-2's default) lm_head.weight *is* wte.weight: find_tied_weights sees it.
`transformers` is an optional extra: `pip install geotrain[hf]`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from geotrain.models.layers import LayerModel, LayerModelError
from geotrain.models.options import ModelOptions, ModelSpecError, seeded_build

DECODER_FAMILIES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "mistral")
"""Model types built as [embed_tokens, decoder layers..., norm + lm_head] (checked equal to the HF forward)."""

_TINY = {"vocab_size": 256, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
_TINY_DECODER = {**_TINY, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
PRESETS: dict[str, dict[str, Any]] = {
    "gpt2-tiny": {"model_type": "gpt2", **_TINY, "n_layer": 4, "n_embd": 64, "n_head": 4, "n_positions": 256,
                  "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    "llama-tiny": {"model_type": "llama", **_TINY_DECODER},
    "qwen2-tiny": {"model_type": "qwen2", **_TINY_DECODER, "tie_word_embeddings": True},
    "mistral-tiny": {"model_type": "mistral", **_TINY_DECODER, "sliding_window": 16},
}
"""Small configs (byte vocabulary, 4 layers, width 64) for tests and first runs; no weights."""

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def _transformers(spec: str) -> Any:
    try:
        import transformers
    except ImportError:
        raise ModelSpecError(f"model spec {spec!r}: the hf: adapter needs transformers "
                             "(pip install 'geotrain[hf]', i.e. transformers==5.24.0)") from None
    return transformers


def _positions(hidden: torch.Tensor) -> torch.Tensor:
    return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)


class GPT2Embedding(nn.Module):
    """Token + position embeddings (+ dropout) of a GPT2LMHeadModel: int64 (B, T) -> (B, T, n_embd)."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] > self.wpe.num_embeddings:
            raise LayerModelError(f"sequence of {input_ids.shape[-1]} tokens is longer than the model's "
                                  f"{self.wpe.num_embeddings} positions")
        return self.drop(self.wte(input_ids) + self.wpe(_positions(input_ids)))


class GPT2Layer(nn.Module):
    """One GPT2Block with its causal mask made from the hidden state."""

    def __init__(self, block: nn.Module, config: Any) -> None:
        super().__init__()
        self.block = block
        self.config = config

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        positions = _positions(hidden)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                                  position_ids=positions)
        return self.block(hidden, None, mask, position_ids=positions)


class DecoderLayer(nn.Module):
    """One Llama-family decoder layer with its mask and rotary cos/sin made from the hidden state.

    `rotary` is the model's rotary module (buffers only, no parameters), shared by the layers.
    """

    def __init__(self, layer: nn.Module, rotary: nn.Module, config: Any, sliding: bool) -> None:
        super().__init__()
        self.layer, self.rotary = layer, rotary
        self.config = config
        self.sliding = sliding

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        positions = _positions(hidden)
        make_mask = create_sliding_window_causal_mask if self.sliding else create_causal_mask
        mask = make_mask(config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                         position_ids=positions)
        cos_sin = self.rotary(hidden, position_ids=positions)
        return self.layer(hidden, attention_mask=mask, position_embeddings=cos_sin, position_ids=positions)


class LMHead(nn.Module):
    """Final norm + LM head: (B, T, hidden) -> logits (B, T, vocab)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


def _is_sliding(config: Any, index: int) -> bool:
    if config.model_type == "mistral":  # MistralModel: one mask for all layers, from sliding_window
        return getattr(config, "sliding_window", None) is not None
    layer_types = getattr(config, "layer_types", None)
    return bool(layer_types) and layer_types[index] == "sliding_attention"


def layers_of_hf_model(model: nn.Module, name: str) -> LayerModel:
    """The layer list of a GPT2LMHeadModel or a Llama/Qwen2/Qwen3/Mistral *ForCausalLM (sharing its modules)."""
    config = model.config
    if config.model_type == "gpt2":
        body = model.transformer
        layers = [GPT2Embedding(body.wte, body.wpe, body.drop), *(GPT2Layer(b, config) for b in body.h),
                  LMHead(body.ln_f, model.lm_head)]
        return LayerModel(name, tuple(layers), config.vocab_size, config.n_positions, config.n_embd)
    if config.model_type in DECODER_FAMILIES:
        body = model.model
        layers = [body.embed_tokens,
                  *(DecoderLayer(layer, body.rotary_emb, config, _is_sliding(config, i))
                    for i, layer in enumerate(body.layers)),
                  LMHead(body.norm, model.lm_head)]
        return LayerModel(name, tuple(layers), config.vocab_size, config.max_position_embeddings, config.hidden_size)
    raise _unsupported(name, config.model_type)


def _unsupported(spec: str, model_type: str) -> ModelSpecError:
    return ModelSpecError(f"model spec {spec!r}: model_type {model_type!r} is not supported by the hf: adapter "
                          f"(gpt2, {', '.join(DECODER_FAMILIES)}); wrap it as file.py:function instead")


def _config_dict(spec: str, target: str) -> dict[str, Any] | None:
    """The config as a dict for presets and config files; None for a directory with weights."""
    path = Path(target)
    if target in PRESETS:
        return dict(PRESETS[target])
    if path.is_dir():
        if any((path / f).exists() for f in _WEIGHT_FILES):
            return None
        path = path / "config.json"
    if not path.is_file():
        raise ModelSpecError(f"model spec {spec!r}: {target!r} is neither a config.json, a local model directory nor "
                             f"a preset ({', '.join(PRESETS)}); geotrain never downloads models")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelSpecError(f"model spec {spec!r}: cannot read {path}: {str(exc)[:120]}") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelSpecError(f"model spec {spec!r}: {path}: model_type: missing (need a Hugging Face config.json)")
    return config


def build_hf_causal_lm(spec: str, target: str, options: ModelOptions) -> nn.Module:
    """The *ForCausalLM of `hf:TARGET` (TARGET a preset name, a config.json or a local model directory).

    A directory with weights is loaded as it is (local_files_only, fp32). Built from a config,
    `options` may override vocab_size, context and n_layer, and the weights are drawn from torch's
    RNG seeded with options.seed (the global RNG is left as it was).
    """
    transformers = _transformers(spec)
    config_dict = _config_dict(spec, target)
    if config_dict is None:
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                target, local_files_only=True, dtype=torch.float32, attn_implementation="sdpa")
        except (OSError, ValueError) as exc:
            raise ModelSpecError(f"model spec {spec!r}: cannot load local weights: {str(exc)[:160]}") from None
        return model.train()
    model_type = config_dict.pop("model_type")
    gpt2 = model_type == "gpt2"
    overrides = {"vocab_size": options.vocab_size, "n_layer" if gpt2 else "num_hidden_layers": options.n_layer,
                 "n_positions" if gpt2 else "max_position_embeddings": options.context}
    config_dict.update({key: value for key, value in overrides.items() if value is not None})
    if not gpt2 and model_type not in DECODER_FAMILIES:
        raise _unsupported(spec, model_type)
    try:
        config = transformers.AutoConfig.for_model(model_type, **config_dict)
    except (ValueError, TypeError) as exc:
        raise ModelSpecError(f"model spec {spec!r}: model_type {model_type!r}: {str(exc)[:160]}") from None
    with seeded_build(options.seed):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                              dtype=torch.float32)
    return model.train()


def load_hf_model(spec: str, target: str, options: ModelOptions) -> LayerModel:
    """`hf:TARGET` as a layer list (see build_hf_causal_lm for TARGET and options)."""
    return layers_of_hf_model(build_hf_causal_lm(spec, target, options), spec)
