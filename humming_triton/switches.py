"""The switches of paths that are not the default everywhere, and where each is on.

A switch (``cutlass_ext.native_op``: the C++ host path of planned calls; ``kernels.moe``: the MoE pipeline;
``kernels.compiled``: inductor launching the Triton kernel itself) is a module global ``ON``:

- ``True`` / ``False``: set by the environment at import (``<ENV>=1`` / ``0``) or by ``set_enabled`` after;
- ``None`` (neither said): the current device's measured table decides -- its ``switches`` section
  (``autotune_configs/<device-slug>.json``) names the paths that a same-run A/B on that device (benchmarks.e2e,
  judged by benchmarks.switch_verdicts) found faster than the default, for the schemes and up to the tokens per
  call it ran.  A device without a table, or whose table does not name the path, keeps it off: nothing untimed
  on a device becomes its default.

Modules call ``module.enabled(tokens, scheme)`` in their forward: dynamo guards the global ``ON`` (graphs for each
value coexist); only while it is None is the table asked (``table_tokens``, folded by dynamo as a constant: one
device kind per process).  A verdict holds for the schemes its A/B ran, up to the tokens per call where it won.
"""
from __future__ import annotations

import functools
import json
import os

from . import state_watch

__all__ = ["from_env", "table_tokens", "measured_switches"]

_VERDICTS: dict[tuple[str, str], int] = {}  # (path, scheme) -> the current device's token limit (0: off)
_ON = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False, "no": False}


def from_env(env: str) -> bool | None:
    """The environment's setting of a switch: 1 / true / on / yes, 0 / false / off / no, or unset (empty): None,
    the device's measured table decides."""
    value = os.environ.get(env, "").strip().lower()
    if value and value not in _ON:
        raise ValueError(f"{env}={os.environ[env]!r}: expected 1 (on), 0 (off) or unset (the device's measured "
                         "table decides)")
    return _ON.get(value) if value else None


@functools.lru_cache(maxsize=None)
def measured_switches(slug: str | None) -> dict:
    """The ``switches`` section of a device's table: path name -> {"on", "max_tokens", "schemes", "evidence", ...}."""
    from .dispatch import table_path
    if not slug or not table_path(slug).exists():
        return {}
    return json.loads(table_path(slug).read_text()).get("switches", {})


def table_tokens(name: str, scheme: str) -> int:
    """Up to how many tokens per call the current device's table turns the path ``name`` on for ``scheme`` (0: off
    there).  The entry's verdict holds for the schemes its A/B ran (``schemes``) up to the largest batch where it
    won (``max_tokens``); an entry that lacks either turns nothing on.  Cached per process: the device current at
    the first call is the one that counts (one device kind per process)."""
    key = (name, scheme)
    hit = _VERDICTS.get(key)
    if hit is None:
        from .capability import device_facts
        entry = measured_switches(device_facts().slug).get(name) or {}
        on = entry.get("on") is True and scheme in entry.get("schemes", ())
        hit = _VERDICTS[key] = int(entry.get("max_tokens", 0)) if on else 0
    return hit


def _forget() -> None:  # a table reloaded (dispatch.clear_caches) or a posed device
    _VERDICTS.clear()
    measured_switches.cache_clear()


state_watch.watch(_forget)
