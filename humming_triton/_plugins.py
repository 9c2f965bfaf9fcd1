"""Self-registering module folders (backends/, kernels/families/): import every module of a package once."""
from __future__ import annotations

import functools
import importlib
import pkgutil


@functools.lru_cache(maxsize=None)
def import_all(package: str) -> None:
    """Import every module of ``package`` (each registers itself on import); later calls do nothing."""
    pkg = importlib.import_module(package)
    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{package}.{mod.name}")
