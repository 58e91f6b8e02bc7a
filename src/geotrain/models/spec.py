"""Resolve a `--model` spec string to a LayerModel: the one entry point of every model adapter.

    tiny | tiny-2layer | small  a TinyGPT preset (models/presets.py): [embedding, block..., head]
    hf:gpt2-tiny                a Hugging Face preset, config.json or local model dir (models/hf.py)
    path/to/file.py:function    a user file; function() returns the layer list
    package.module:function     the same from an importable module

A user function takes no arguments and returns an nn.Sequential, a list/tuple of nn.Modules or a
LayerModel; it runs with torch's RNG seeded by ModelOptions.seed, so every rank gets the same weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
import threading
from pathlib import Path
from typing import Any

from torch import nn

from geotrain.models.gpt import make_model
from geotrain.models.layers import LayerModel, LayerModelError
from geotrain.models.options import ModelOptions, ModelSpecError, seeded_build
from geotrain.models.presets import MODEL_PRESETS


def preset_model(spec: str, options: ModelOptions) -> LayerModel:
    """The TinyGPT preset `spec` (MODEL_PRESETS, with the options' vocab_size / context / n_layer) as a layer list."""
    overrides = {"vocab_size": options.vocab_size, "context": options.context, "n_layer": options.n_layer}
    config = dataclasses.replace(MODEL_PRESETS[spec], **{k: v for k, v in overrides.items() if v is not None})
    model = make_model(config, seed=options.seed)
    return LayerModel(spec, (model.embed, *model.blocks, model.head), config.vocab_size, config.context,
                      config.d_model)


def _load_function(spec: str, target: str, name: str) -> Any:
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target)
        if not path.is_file():
            raise ModelSpecError(f"model spec {spec!r}: file {target!r} not found")
        module_name = "geotrain_user_model_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ModelSpecError(f"model spec {spec!r}: {target!r} is not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up here
        try:
            module_spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:  # the user's code (sys.exit included): report it in one line
            sys.modules.pop(module_name, None)
            raise ModelSpecError(f"model spec {spec!r}: importing {target} raised "
                                 f"{type(exc).__name__}: {str(exc)[:160]}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ModelSpecError(f"model spec {spec!r}: cannot import module {target!r}: {str(exc)[:160]}") from None
        except (Exception, SystemExit) as exc:  # the module's own code failed (sys.exit included)
            raise ModelSpecError(f"model spec {spec!r}: importing {target} raised "
                                 f"{type(exc).__name__}: {str(exc)[:160]}") from exc
    function = getattr(module, name, None)
    if function is None:
        raise ModelSpecError(f"model spec {spec!r}: {target} has no function {name!r}")
    if not callable(function):
        raise ModelSpecError(f"model spec {spec!r}: {target}:{name} is a {type(function).__name__}, not a function")
    return function


def _vocab_of(layers: tuple[nn.Module, ...]) -> int | None:
    """The first layer's first nn.Embedding size, else the last layer's last nn.Linear width, else None."""
    for module in layers[0].modules():
        if isinstance(module, nn.Embedding):
            return module.num_embeddings
    linears = [m for m in layers[-1].modules() if isinstance(m, nn.Linear)]
    return linears[-1].out_features if linears else None


def _bounded(call: Any, timeout_s: float, spec: str, what: str) -> Any:
    """`call()` in a daemon thread, waited for at most `timeout_s`: a user's builder that never returns
    cannot hang the launcher or a worker (the thread is abandoned; the process ends with the error)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="geotrain-model-build", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ModelSpecError(f"model spec {spec!r}: {what} did not return within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _build(spec: str, target: str, name: str) -> Any:
    function = _load_function(spec, target, name)
    try:
        return function()
    except (Exception, SystemExit) as exc:  # the user's code (sys.exit included)
        raise ModelSpecError(f"model spec {spec!r}: {name}() raised {type(exc).__name__}: {str(exc)[:160]}") from exc


def user_model(spec: str, target: str, name: str, options: ModelOptions) -> LayerModel:
    """The layer list returned by the user function `target:name` (file path or module), imported and
    called within options.build_timeout_s."""
    with seeded_build(options.seed):
        result = _bounded(lambda: _build(spec, target, name), options.build_timeout_s, spec,
                          f"importing {target} and calling {name}()")
    if isinstance(result, LayerModel):
        return result
    if isinstance(result, (nn.Sequential, nn.ModuleList)):
        layers = tuple(result)
    elif isinstance(result, (list, tuple)) and result and all(isinstance(m, nn.Module) for m in result):
        layers = tuple(result)
    else:
        got = type(result).__name__
        if isinstance(result, (list, tuple)):
            got = f"{got} of {[type(m).__name__ for m in result][:4]}"
        raise ModelSpecError(f"model spec {spec!r}: {name}() must return an nn.Sequential, a non-empty list of "
                             f"nn.Modules or a LayerModel, got {got}")
    try:
        return LayerModel(spec, layers, _vocab_of(layers))
    except LayerModelError as exc:
        raise ModelSpecError(f"model spec {spec!r}: {exc}") from None


def load_model_spec(spec: str, options: ModelOptions | None = None) -> LayerModel:
    """The LayerModel named by `spec` (see the module docstring for the four forms)."""
    options = options or ModelOptions()
    if spec in MODEL_PRESETS:
        return preset_model(spec, options)
    if spec.startswith("hf:"):
        from geotrain.models.hf import load_hf_model

        target = spec[3:]
        if not target:
            raise ModelSpecError("model spec 'hf:': name a preset, a config.json or a local model directory after hf:")
        return load_hf_model(spec, target, options)
    target, colon, name = spec.rpartition(":")
    if not colon or not target or not name.isidentifier():
        raise ModelSpecError(f"model spec {spec!r}: expected tiny, hf:SPEC, path/to/file.py:function "
                             "or package.module:function")
    return user_model(spec, target, name, options)
