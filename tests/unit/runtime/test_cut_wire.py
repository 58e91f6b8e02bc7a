"""Packed activation wires on pipeline cuts (runtime/cut_wire.py, the PackedWire paths of runtime/stages.py)."""

import numpy as np
import pytest
import torch

from geotrain.cluster import make_network
from geotrain.codecs import CodecSpec, get_codec
from geotrain.models import TINY_GPT
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.cut_wire import PackedWire
from geotrain.runtime.stages import stage_modules, stage_shapes, tiny_layer_model

GEO = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0)  # 10 Mbit/s, 20 ms between regions


def _roundtrip_rows(name: str, x: torch.Tensor) -> torch.Tensor:
    codec = get_codec(name)
    return torch.stack([codec.decode(codec.encode(row)) for row in x])


@pytest.mark.parametrize("name", ["int8-block", "int4-block", "sign-block", "rotated-sign",
                                  "rotated-ternary"])
def test_activations_and_their_gradients_cross_encoded_by_the_codec(name):
    wire = PackedWire(CodecSpec(name))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, 32, generator=generator, requires_grad=True)
    carrier = wire.send(x)
    assert carrier.shape == wire.carrier_shape((3, 6, 32)) and carrier.dtype == torch.float32
    received = wire.receive(carrier.detach().clone().requires_grad_(), (6, 32))  # the link copies the bytes
    assert torch.equal(received, _roundtrip_rows(name, x.detach()))
    grad = torch.randn(3, 6, 32, generator=generator)
    carrier_in = carrier.detach().clone().requires_grad_()
    wire.receive(carrier_in, (6, 32)).backward(grad)
    assert carrier_in.grad.shape == carrier.shape  # what torch's schedule sends back: the carrier's shape
    carrier.backward(carrier_in.grad.clone())
    assert torch.equal(x.grad, _roundtrip_rows(name, grad))


def test_two_packed_stages_compute_the_model_within_the_codecs_error():
    model = tiny_layer_model(TINY_GPT, seed=0)
    cuts = (0, 3, model.n_layers)
    tokens = torch.randint(0, TINY_GPT.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    reference = torch.nn.Sequential(*model.layers)(tokens)
    for name, tolerance in (("int8-block", 0.02), ("int4-block", 0.2)):
        wire = PackedWire(CodecSpec(name))
        stages = stage_modules(model, cuts, [0, 1], wire, seq_len=16)
        shapes = stage_shapes(model, cuts, 2, 16, wire)
        carrier = stages[0](tokens)
        assert tuple(carrier.shape) == shapes[0].output_shape == shapes[1].input_shape
        assert carrier.nbytes == 2 * 4 * -(-get_codec(name).wire_nbytes((16, TINY_GPT.d_model)) // 4)
        logits = stages[1](carrier)
        error = float(((logits - reference).norm() / reference.norm()).detach())
        assert 0 < error < tolerance, (name, error)
    with pytest.raises(ValueError, match="needs seq_len"):
        stage_modules(model, cuts, [1], PackedWire(CodecSpec("int4-block")))


def test_pp_codec_takes_packed_codecs_and_refuses_data_dependent_ones():
    base = {"cluster": GEO, "assignment": np.array([[0, 2], [1, 3]])}
    wire = RuntimeConfig.of(**base, pp_codec="int4-block:block_size=64").comm.wire_dtypes()
    assert isinstance(wire, PackedWire) and wire.codec.block_size == 64
    assert RuntimeConfig.of(**base, pp_codec="fp16").comm.wire_dtypes() == torch.float16
    for name in ("powersgd:rank=2", "topk-lowbit:fraction=0.0625"):  # fixed k per chunk, fixed rank: fixed sizes
        assert isinstance(RuntimeConfig.of(**base, pp_codec=name).comm.wire_dtypes(), PackedWire)
    for name in ("topk", "randk"):
        with pytest.raises(ValueError, match="payload layout depends on the data"):
            RuntimeConfig.of(**base, pp_codec=name)
