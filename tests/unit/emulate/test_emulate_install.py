"""Which backend strings `install` turns into the emulating backend."""

import pytest

from geotrain.emulate.install import _swap
from geotrain.emulate.process_group import BACKEND_NAME


@pytest.mark.parametrize("given, expected", [
    (None, BACKEND_NAME), ("gloo", BACKEND_NAME), ("cpu:gloo", BACKEND_NAME),
    ("cpu:gloo,cuda:nccl", f"cpu:{BACKEND_NAME},cuda:nccl"),  # per device: only the cpu entry
    ("cuda:nccl, cpu:gloo", f"cuda:nccl,cpu:{BACKEND_NAME}"),
    ("nccl", "nccl"), ("cpu:mpi,cuda:nccl", "cpu:mpi,cuda:nccl"),  # no gloo on cpu: left alone
])
def test_gloo_on_cpu_becomes_the_emulating_backend(given, expected):
    assert _swap(given) == expected
