"""Observers of the dispatch state that call plans depend on (the measured table's generation, a posed device,
batch-invariant mode; ``plans._state``).  Python plans compare that state on every call; a cache of plans kept
outside Python (the C++ op's, cutlass_ext/native_op.py) cannot, so it registers here and is told of each change."""
from __future__ import annotations

from typing import Callable

from . import capability

__all__ = ["watch", "changed"]

_OBSERVERS: list[Callable[[], None]] = []


def watch(fn: Callable[[], None]) -> None:
    if fn not in _OBSERVERS:
        _OBSERVERS.append(fn)


def changed() -> None:
    for fn in _OBSERVERS:
        fn()


capability._observers.append(changed)  # a posed device (capability.pose_as / set_override) is dispatch state too
