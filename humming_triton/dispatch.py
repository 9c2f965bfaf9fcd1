"""Dispatch: (op, scheme, shape, device, requested backend) -> (backend, kernel family, config).

How ``backend="auto"`` decides, in order:

1. CPU tensors (no interpreter): the ``reference`` backend.
2. The device's measured table (``autotune_configs/<device-slug>.json``, section ``dispatch``, written by
   ``python -m humming_triton.tune``): entries keyed ``op|scheme|NxK|m<bucket>`` (M rounded up to a power of
   two) list every candidate timed there (backend x family x config), fastest first.  ``auto`` takes the
   fastest candidate that can run this call.  Without an exact key the *nearest* entry of the same op and M
   bucket is used: same scheme first, then a scheme of the same format class (bit width, float/int codes,
   zero-point kind, activation type), then any scheme with the same activation type -- nearest shape by
   |log2 N/N'| + |log2 K/K'| (and experts) -- so on a tuned device ``auto`` runs (family, config) pairs that
   were timed there.
3. No table entry for the op and M bucket (or none whose candidates can run the call; an untuned GPU, the
   interpreter): the Triton backend's
   built-in heuristic (``kernels/configs.py``; its large-M regime is dequantize + cuBLAS), else -- where this
   GPU lacks the MMA every Triton family needs (capability.py) -- a torch-composed path.
4. Nothing fast can run the call on CUDA: the reference, with a one-time warning saying why.

An explicit ``backend=`` runs that backend or raises a clear error; it takes its own fastest measured
candidate where the table has one.  Nothing here times or compiles: tuning is an offline command, so serving
and CUDA-graph capture never tune.  Device facts are read lazily: importing the package touches no CUDA.
"""
from __future__ import annotations

import functools
import json
import math
import os
import warnings
from pathlib import Path

import torch

from . import backends, capability, state_watch
from .batch_invariant import is_batch_invariant
from .calls import Call, Candidate, interpreting, m_bucket
from .formats.scheme import QuantScheme
from .formats.weight import QuantWeight

__all__ = ["select", "select_backend", "last_backend", "last_plan", "explain", "table_path", "clear_caches", "check_backend_name",
           "interpreting"]

CONFIG_DIR = Path(os.environ.get("HUMMING_TRITON_CONFIG_DIR",
                                 Path(__file__).resolve().parents[1] / "autotune_configs"))
_last: dict[str, tuple] = {}
_generation = [0]  # bumped by clear_caches: every QuantWeight's cached choice is then stale


def triton_available() -> bool:
    from .backends.triton import triton_available as avail
    return avail()


def table_path(slug: str) -> Path:
    return CONFIG_DIR / f"{slug}.json"


@functools.lru_cache(maxsize=None)
def measured_table(slug: str | None) -> dict:
    """The ``dispatch`` section of a device's table ({} when the device has none)."""
    if not slug:
        return {}
    path = table_path(slug)
    if not path.exists():
        return {}
    return json.loads(path.read_text()).get("dispatch", {})


def clear_caches() -> None:
    """Forget loaded tables and cached choices (after a tuning run, or in tests that swap the table)."""
    measured_table.cache_clear()
    _generation[0] += 1
    state_watch.changed()


def _format_class(s: QuantScheme) -> tuple:
    act = None if s.act is None else str(s.act.dtype)
    return (s.bits, type(s.weight).__name__, s.zero, act)


def _parse_key(key: str):
    op, scheme, shape, mb = key.split("|")
    dims = tuple(int(d) for d in shape.split("x"))
    return op, scheme, dims, int(mb[1:])


def table_entry(call: Call, table: dict) -> tuple[str, dict] | None:
    """(key, entry) of the measured entry that governs ``call`` (exact, else nearest; module docstring)."""
    if call.table_key in table:
        return call.table_key, table[call.table_key]
    want = (call.experts, call.n, call.k) if call.experts else (call.n, call.k)
    cls = _format_class(call.scheme)
    best = None
    for key, entry in table.items():
        try:
            op, scheme, dims, mb = _parse_key(key)
        except ValueError:
            continue
        if op != call.op or mb != m_bucket(call.m) or len(dims) != len(want):
            continue
        if scheme == call.scheme.name:
            rank = 0
        else:
            try:
                other = _format_class(QuantScheme.parse(scheme))
            except ValueError:
                continue
            if other[3] != cls[3]:  # another activation type: its timings say nothing about this call
                continue
            rank = 1 if other == cls else 2
        dist = sum(abs(math.log2(a / b)) for a, b in zip(want, dims))
        if best is None or (rank, dist) < best[0]:
            best = ((rank, dist), key, entry)
    return None if best is None else (best[1], best[2])


def _measured_choice(call: Call, table: dict, only: str | None) -> Candidate | None:
    found = table_entry(call, table)
    if found is None:
        return None
    for c in found[1].get("candidates", []):
        cand = Candidate.from_json(c)
        if only is not None and cand.backend != only:
            continue
        if only is None and not _auto_allowed(cand.backend):
            continue
        if _can_run(call, cand):
            return cand
    return None


def _auto_allowed(name: str) -> bool:
    reg = backends.registered()
    return name in reg and reg[name].auto


def _can_run(call: Call, cand: Candidate) -> bool:
    if backends.get(cand.backend).reason(call) is not None:
        return False
    if cand.family in ("default", "fused_moe"):
        return True
    from .backends._families import family_reason
    from .kernels import families
    try:
        fam = families.get(cand.family)
    except ValueError:  # a family that no longer exists in this version
        return False
    return family_reason(fam, call) is None and (cand.config is None or fam.config_reason(call, cand.config) is None)


def _facts(x: torch.Tensor):
    from .capability import device_facts
    return device_facts(x.device)


def call_for(op: str, x: torch.Tensor, qw: QuantWeight) -> Call:
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    return Call(op, qw.scheme, x.dtype, rows, qw.N, qw.K, qw.num_experts or 0, qw.k_perm is not None,
                "cuda" if x.is_cuda else x.device.type, _facts(x))


def _reasons(call: Call, name: str, more: tuple) -> tuple[str | None, str]:
    """(why backend ``name`` cannot run the call or any of the further weights, the scheme concerned)."""
    b = backends.get(name)
    for c in (call, *more):
        why = b.reason(c)
        if why:
            return why, c.scheme.name
    return None, call.scheme.name


def select(op: str, x: torch.Tensor, qw: QuantWeight, backend: str = "auto", *more: QuantWeight
           ) -> tuple[backends.Backend, Candidate | None]:
    """The backend object and candidate that run this call.  ``more``: further weights of the same call
    (fused MoE's down projection), checked like ``qw``.

    The choice is cached on the QuantWeight per call signature (a few µs of host time per call otherwise);
    ``clear_caches`` and a posed device (capability.pose_as) start afresh."""
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    key = (op, backend, x.dtype, rows, x.device, _generation[0], capability._override,
           tuple(map(id, more)) if more else (), is_batch_invariant())  # the hot path: no imports, no genexpr
    per = qw.cache.get("dispatch")
    if per is None:
        per = qw.cache["dispatch"] = {}
    hit = per.get(key)
    if hit is None:
        call = call_for(op, x, qw)
        more_calls = tuple(call_for(op, x, w) for w in more)
        if is_batch_invariant():
            name, cand = _decide_invariant(call, x, backend, more_calls, qw.input_scale is not None)
        else:
            name, cand = _decide(call, x, backend, more_calls)
        if len(per) >= 256:
            per.clear()
        hit = per[key] = (backends.get(name), cand)
    _last[op] = hit
    return hit


def check_backend_name(backend: str) -> None:
    if backend not in ("auto", *backends.names()):
        raise ValueError(f"unknown backend {backend!r}; expected 'auto' or one of {backends.names()}")


def _decide(call: Call, x: torch.Tensor, backend: str, more: tuple) -> tuple[str, Candidate | None]:
    check_backend_name(backend)
    if backend == "reference":
        return "reference", None
    if backend != "auto":
        why, scheme = _reasons(call, backend, more)
        if why:
            raise RuntimeError(f"backend={backend!r} cannot run {call.op} for scheme {scheme}: {why}")
        if call.op == "fused_moe":  # named: its grouped GEMMs run on this backend too (auto's get None)
            return backend, Candidate(backend, "fused_moe")
        cand = _measured_choice(call, measured_table(call.facts.slug), backend) or backends.get(backend).default(call)
        return backend, cand
    if not (x.is_cuda or interpreting()):
        return "reference", None
    if call.op == "fused_moe":  # two grouped GEMMs and routing: one path per backend, not in the table
        why, scheme = _reasons(call, "triton", more)
        if why is None:
            return "triton", None
        _warn_once(call.op, scheme, why)
        return "reference", None
    cand = _measured_choice(call, measured_table(call.facts.slug), None)
    if cand is not None:
        return cand.backend, cand
    why, scheme = _reasons(call, "triton", more)
    if why is None:
        cand = backends.get("triton").default(call)
        return cand.backend, cand  # the heuristic's dequantize + cuBLAS regime belongs to the torch backend
    if _reasons(call, "torch", more)[0] is None:  # e.g. W8A8-INT8 on SM 10.0: no fast int8 MMA -> dequant + cuBLAS
        return "torch", backends.get("torch").default(call)
    if x.is_cuda:
        _warn_once(call.op, scheme, why)
    return "reference", None


def _decide_invariant(call: Call, x: torch.Tensor, backend: str, more: tuple, static: bool
                      ) -> tuple[str, Candidate | None]:
    """Batch-invariant mode (batch_invariant.py): one M-independent path, or a clear error."""
    from .backends._families import family_reason
    from .batch_invariant import invariant_candidate, invariant_reason
    from .kernels import families
    check_backend_name(backend)
    why = invariant_reason(call, backend, static)
    if why:
        raise RuntimeError(f"batch-invariant mode: {why}")
    if backend == "reference" or not (x.is_cuda or interpreting()):
        return "reference", None  # computed row by row (backends/reference.py)
    cand = invariant_candidate(call)
    why, scheme = _reasons(call, "triton", more)
    why = why or family_reason(families.get(cand.family), call)
    if why:
        raise RuntimeError(f"batch-invariant mode runs the triton backend's {cand.family} kernel, which cannot run "
                           f"{call.op} for {scheme}: {why}")
    return "triton", cand


def select_backend(op: str, x: torch.Tensor, qw: QuantWeight, backend: str = "auto", *more: QuantWeight) -> str:
    """The name of the backend that runs this call (public; ``select`` also gives the family and config)."""
    return select(op, x, qw, backend, *more)[0].name


def explain(op: str, x: torch.Tensor, qw: QuantWeight, backend: str = "auto") -> str:
    """A sentence saying what would run this call and why (the table entry, or the fallback taken)."""
    b, cand = select(op, x, qw, backend)
    call = call_for(op, x, qw)
    table = measured_table(call.facts.slug)
    found = table_entry(call, table) if table else None
    src = f"measured entry {found[0]}" if found and cand is not None and found[1].get("candidates") else \
        "no measured entry: built-in heuristic"
    return f"{op} {call.table_key}: {b.name}" + (f"/{cand.describe()}" if cand else "") + f" ({src})"


@functools.lru_cache(maxsize=None)
def _warn_once(op: str, scheme: str, why: str) -> None:
    warnings.warn(f"humming_triton: {op} for {scheme} falls back to the slow torch reference on CUDA: {why}",
                  stacklevel=4)


def last_backend(op: str = "quant_linear") -> str | None:
    """The backend the most recent call of ``op`` ran on (for demos and logs)."""
    got = _last.get(op)
    return got[0].name if got else None


def last_plan(op: str = "quant_linear") -> str | None:
    """backend/family/config of the most recent call of ``op`` (e.g. ``triton/swapab bm=16 bn=128 ...``)."""
    got = _last.get(op)
    if not got:
        return None
    b, cand = got
    return cand.describe() if cand is not None else b.name
