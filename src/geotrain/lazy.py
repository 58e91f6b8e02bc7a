"""Package attributes imported on first use (PEP 562): `import geotrain.cost.memory` or
`geotrain.runtime.config` runs the package's __init__, which must not pull in numba, scipy or
torch.distributed.pipelining for names the caller never touches (seconds of start-up per process)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, homes: dict[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package`: name -> the module `homes[name]` defines it in; a name
    is imported once, then cached in the package's `namespace` (its globals())."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
