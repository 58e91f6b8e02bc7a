"""Shared fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's training tests on one torch thread (as the demo does), restoring the count after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
