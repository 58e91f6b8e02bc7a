"""The environment torchrun gives a rank (env:// rendezvous), built in one place for every launcher."""

from __future__ import annotations

import os
from collections.abc import Mapping


def torchrun_env(rank: int, world_size: int, master_addr: str, master_port: int, *, local_rank: int | None = None,
                 local_world_size: int | None = None, group_rank: int | None = 0,
                 base: Mapping[str, str] | None = None, single_thread: bool = True,
                 **extra: str) -> dict[str, str]:
    """`base` (default: os.environ) plus RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
    ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and `extra`; `single_thread`: OMP_NUM_THREADS=1
    unless set, as torchrun. Defaults are one host: local rank = rank, local world = world, group rank 0
    (None: GROUP_RANK not set, where the caller does not know its host's index)."""
    env = dict(os.environ if base is None else base)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank if local_rank is None else local_rank),
                "LOCAL_WORLD_SIZE": str(world_size if local_world_size is None else local_world_size),
                "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)})
    if group_rank is not None:
        env["GROUP_RANK"] = str(group_rank)
    env.update(extra)
    if single_thread:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env
