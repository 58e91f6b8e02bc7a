"""Run any torch.distributed program as if on a cluster's links: an emulating process-group backend."""

from geotrain.emulate.install import Emulation, install
from geotrain.emulate.network import EmulatedNetwork, EmulationError, LinkDown
from geotrain.emulate.process_group import BACKEND_NAME, EmulatedProcessGroup
from geotrain.emulate.rank_clock import emulated_clock, host_work, start_loop
from geotrain.emulate.schedule import Transfer, run_rounds
from geotrain.emulate.torchft_groups import TorchftGroups

__all__ = ["BACKEND_NAME", "EmulatedNetwork", "EmulatedProcessGroup", "Emulation", "EmulationError", "LinkDown",
           "TorchftGroups", "Transfer", "emulated_clock", "host_work", "install", "run_rounds",
           "start_loop"]
