"""The switches of paths that are not the default everywhere, and where each is on.

A switch (``cutlass_ext.native_op``: the C++ host path of planned calls; ``kernels.moe``: the MoE pipeline;
``kernels.compiled``: inductor launching the Triton kernel itself) is a module global ``ON``:

- ``True`` / ``False``: set by the environment at import (``<ENV>=1`` / ``0``) or by ``set_enabled`` after;
- ``None`` (neither said): the current device's measured table decides -- its ``switches`` section
  (``autotune_configs/<device-slug>.json``) names the paths that a same-run A/B on that device (benchmarks.e2e,
  judged by benchmarks.switch_verdicts) found faster than the default, up to the tokens per call it ran
  (``max_tokens``: the native op and the MoE pipeline take the token count of the call).  A device without a table, or whose table does not name the path, keeps it off:
  nothing untimed on a device becomes its default.

Modules read ``module.ON`` in their forward (dynamo guards a module global's value: graphs for each value coexist);
only while it is None do they ask ``measured(name)``, which dynamo folds as a constant (one device per process).
"""
from __future__ import annotations

import functools
import json
import os
import sys

from . import state_watch

__all__ = ["from_env", "measured", "measured_tokens", "measured_switches"]

_MEASURED: dict[str, bool] = {}  # name -> the current device's verdict (a forward asks on every eager call)


def from_env(env: str) -> bool | None:
    """The environment's setting of a switch: ``1`` on, ``0`` off, unset (or empty) None: the device decides."""
    value = os.environ.get(env, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{env}={value!r}: expected 1 (on), 0 (off) or unset (the device's measured table decides)")
    return None if value == "" else value == "1"


@functools.lru_cache(maxsize=None)
def measured_switches(slug: str | None) -> dict:
    """The ``switches`` section of a device's table: path name -> {"on": bool, "evidence": str, ...}."""
    from .dispatch import table_path
    if not slug or not table_path(slug).exists():
        return {}
    return json.loads(table_path(slug).read_text()).get("switches", {})


def measured(name: str) -> bool:
    """Whether the current device's measured table turns the path ``name`` on (False without CUDA or an entry)."""
    hit = _MEASURED.get(name)
    if hit is None:
        from .capability import device_facts
        entry = measured_switches(device_facts().slug).get(name)
        hit = _MEASURED[name] = bool(entry and entry.get("on"))
    return hit


def measured_tokens(name: str) -> int:
    """Up to how many tokens per call the current device's table turns the path ``name`` on: its entry's
    ``max_tokens`` (the largest batch its A/B ran: a path is on by default only at sizes it was timed at),
    unbounded for an entry without one, 0 where it is off."""
    if not measured(name):
        return 0
    from .capability import device_facts
    return int(measured_switches(device_facts().slug)[name].get("max_tokens", sys.maxsize))


def _forget() -> None:  # a table reloaded (dispatch.clear_caches) or a posed device
    _MEASURED.clear()
    measured_switches.cache_clear()


state_watch.watch(_forget)
