"""What a GPU can do: its device facts (SM version, SM count, shared memory, name) and the SM capability table
that decides which tensor-core paths may run on it at all.

Importing this module touches neither CUDA nor torch (torch is imported inside ``device_facts`` only), so that
``scripts/compile_check.py`` can load it by path in an environment that has only Triton.

* ``device_facts(device)`` -- read lazily from ``torch.cuda.get_device_properties`` (cached per device index).
  A non-CUDA device (CPU tensors under the Triton interpreter) gets ``CPU_FACTS``: an H200-like fact set
  (SM 9.0, 132 SMs, 227 KiB of shared memory per block) named ``"cpu-interpreter"`` with ``slug=None`` -- the
  interpreter has no tuned config file, so config lookup falls through to the heuristics, which are tuned for
  the H200.
* ``pose_as(facts_or_sm)`` -- tests (and what-if tools) make ``device_facts()`` answer with posed facts for every
  device while the context is active; ``facts_for_sm(sm)`` builds a plausible fact set for an SM.
* ``capability(facts)`` -- the table row; ``mma_reason(kind, facts)`` -- None or a sentence saying why not;
  ``kernel_mma_kind(act, x_dtype)`` -- which MMA kind a tiled kernel needs for given activations.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch

__all__ = ["DeviceFacts", "Capability", "CPU_FACTS", "TABLE", "MMA_KINDS", "device_facts", "facts_for_sm",
           "pose_as", "set_override", "clear_override", "capability", "mma_reason", "kernel_mma_kind", "slug_of"]


@dataclass(frozen=True)
class DeviceFacts:
    sm: tuple[int, int]
    num_sms: int
    smem_per_block: int  # bytes a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    name: str
    slug: str | None  # autotune_configs/<slug>.json; None: no config file (the interpreter)


def slug_of(name: str) -> str:
    """Config-file slug of a device name: "NVIDIA H200" -> "h200" (the rule that named the existing
    autotune_configs files: lower case, "nvidia" dropped, spaces and dashes to underscores)."""
    return name.lower().replace("nvidia", "").strip().replace(" ", "_").replace("-", "_")


@dataclass(frozen=True)
class Capability:
    fp16_mma: bool  # fp16 tensor-core MMA (mma.sync / wgmma / tcgen05)
    bf16_mma: bool
    fp8_mma: bool  # e4m3 / e5m2 operands (and Triton's fp8e4nv conversions, which it allows from sm_89)
    int8_mma: bool  # a *fast* int8 tensor-core MMA
    wgmma: bool  # Hopper's warpgroup MMA (sm_90a only; Blackwell replaced it with tcgen05)
    block_scaled_mma: bool  # MMA that applies e8m0 / ue4m3 block scales itself (MX / NV formats)
    tma: bool  # the tensor memory accelerator (cp.async.bulk.tensor)
    notes: str


KIB = 1024
# Rows only where something changes.  TMA is not Hopper-only like wgmma: the bulk-tensor copies exist on every
# SM from 9.0 on (Triton runs its TMA lowering for every capability major >= 9), so tma stays True on 10.0 / 12.0.
_FLAGS = ("fp16_mma", "bf16_mma", "fp8_mma", "int8_mma", "wgmma", "block_scaled_mma", "tma")


def _has(flags: str, notes: str) -> Capability:
    """A row from the names of the flags it has (the others are False)."""
    on = set(flags.split())
    assert on <= set(_FLAGS), on - set(_FLAGS)
    return Capability(**{f: f in on for f in _FLAGS}, notes=notes)


TABLE: dict[tuple[int, int], Capability] = {
    (7, 5): _has("fp16_mma int8_mma",
                 "Turing: mma.sync fp16 and int8/int4 only; no bf16 MMA (Triton has no bf16 dot below sm_80)"),
    (8, 0): _has("fp16_mma bf16_mma int8_mma", "Ampere A100: mma.sync fp16/bf16/tf32/int8, cp.async; no fp8"),
    (8, 6): _has("fp16_mma bf16_mma int8_mma", "Ampere GA10x: as 8.0 with 99 KiB of shared memory per block"),
    (8, 9): _has("fp16_mma bf16_mma fp8_mma int8_mma", "Ada: adds mma.sync e4m3/e5m2 (fp8); no wgmma, no TMA"),
    (9, 0): _has("fp16_mma bf16_mma fp8_mma int8_mma wgmma tma",
                 "Hopper (sm_90a): wgmma fp16/bf16/fp8/int8 and TMA; Triton targets sm_90a itself"),
    (10, 0): _has("fp16_mma bf16_mma fp8_mma block_scaled_mma tma",
                  "datacenter Blackwell (sm_100a): tcgen05 MMA with TMEM accumulators, block-scaled MX/NV MMA; no "
                  "wgmma.  Its new tensor-core instructions are treated as having no fast int8 path (Humming: "
                  "B300 drops fast INT8), so W8A8-INT8 routes away"),
    (12, 0): _has("fp16_mma bf16_mma fp8_mma int8_mma block_scaled_mma tma",
                  "GeForce Blackwell (sm_120a): mma.sync incl. block-scaled MX/NV fp4/fp6/fp8 and int8; no "
                  "tcgen05, no wgmma; ~99 KiB of shared memory per block"),
}
# Below the lowest row (Volta, Pascal, ...): no tensor-core path is assumed.
NO_TENSOR_CORES = _has("", "below SM 7.5 (the table's lowest row): no tensor-core paths assumed")

# A representative GPU per row: (name, SMs, opt-in shared memory per block).  Only config heuristics read the
# numbers, so "plausible" is enough.
_EXAMPLES: dict[tuple[int, int], tuple[str, int, int]] = {
    (7, 5): ("Tesla T4", 40, 64 * KIB),
    (8, 0): ("NVIDIA A100-SXM4-80GB", 108, 163 * KIB),
    (8, 6): ("NVIDIA RTX A6000", 84, 99 * KIB),
    (8, 9): ("NVIDIA L40S", 142, 99 * KIB),
    (9, 0): ("NVIDIA H200", 132, 227 * KIB),
    (10, 0): ("NVIDIA B200", 148, 227 * KIB),
    (12, 0): ("NVIDIA GeForce RTX 5090", 170, 99 * KIB),
}

CPU_FACTS = DeviceFacts((9, 0), 132, 227 * KIB, "cpu-interpreter", None)


def _row(sm: tuple[int, int]) -> tuple[int, int] | None:
    """The table row an SM resolves to: itself, else the nearest lower row -- which is the nearest lower row of
    the same major whenever one exists (8.7 -> 8.6, 10.3 -> 10.0, 12.1 -> 12.0) and the nearest lower row
    overall otherwise (11.0 -> 10.0).  None below the lowest row (7.0 and older)."""
    lower = [r for r in TABLE if r <= tuple(sm)]
    return max(lower) if lower else None


def capability(facts: DeviceFacts | tuple[int, int]) -> Capability:
    """The capability row of a device (or of an SM tuple); unknown SMs resolve as ``_row`` says."""
    sm = facts.sm if isinstance(facts, DeviceFacts) else tuple(facts)
    row = _row(sm)
    return TABLE[row] if row is not None else NO_TENSOR_CORES


def facts_for_sm(sm: tuple[int, int]) -> DeviceFacts:
    """Plausible facts for an SM: the example GPU of its row (a table SM: its name and config slug), or of the row
    it resolves to, named "posed SM x.y (...-like)" with slug None (an SM between rows); below the table, a
    T4-sized device."""
    sm = (int(sm[0]), int(sm[1]))
    row = _row(sm) or (7, 5)
    name, sms, smem = _EXAMPLES[row]
    if row != sm:  # an imaginary GPU: no config file can be meant for it
        return DeviceFacts(sm, sms, smem, f"posed SM {sm[0]}.{sm[1]} ({name}-like)", None)
    return DeviceFacts(sm, sms, smem, name, slug_of(name))


# ---- device facts: lazy, cached, injectable --------------------------------------------------------------------

_override: DeviceFacts | None = None
# told of every change of _override (humming_triton.state_watch adds itself; this module imports nothing of ours)
_observers: list = []


def _changed() -> None:
    for fn in _observers:
        fn()


def set_override(facts_or_sm: DeviceFacts | tuple[int, int]) -> None:
    """Make ``device_facts()`` return these facts for every device until ``clear_override()``."""
    global _override
    _override = facts_or_sm if isinstance(facts_or_sm, DeviceFacts) else facts_for_sm(facts_or_sm)
    _changed()


def clear_override() -> None:
    global _override
    _override = None
    _changed()


@contextlib.contextmanager
def pose_as(facts_or_sm: DeviceFacts | tuple[int, int]) -> Iterator[DeviceFacts]:
    """``with pose_as((8, 0)) as f:`` -- device_facts() answers ``f`` (for CPU and CUDA devices alike, without
    touching CUDA) inside the block; nests, and restores the previous override on exit."""
    global _override
    before = _override
    set_override(facts_or_sm)
    try:
        yield _override
    finally:
        _override = before
        _changed()


@functools.lru_cache(maxsize=None)
def _cuda_facts(index: int) -> DeviceFacts:
    import torch
    p = torch.cuda.get_device_properties(index)
    # torch exposes the opt-in maximum from 2.5 on; older builds: the row's example value
    smem = getattr(p, "shared_memory_per_block_optin", 0) or facts_for_sm((p.major, p.minor)).smem_per_block
    return DeviceFacts((p.major, p.minor), p.multi_processor_count, smem, p.name, slug_of(p.name))


def device_facts(device: "torch.device | str | int | None" = None) -> DeviceFacts:
    """Facts of ``device`` (default: the current CUDA device if CUDA is available, else the CPU).  A posed
    override wins for every device; a non-CUDA device (the interpreter's CPU tensors) gets ``CPU_FACTS``."""
    if _override is not None:
        return _override
    import torch
    if device is None:
        if not torch.cuda.is_available():
            return CPU_FACTS
        device = torch.device("cuda")
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type != "cuda":
        return CPU_FACTS
    return _cuda_facts(device.index if device.index is not None else torch.cuda.current_device())


# ---- MMA kinds -------------------------------------------------------------------------------------------------

# kind -> (the Capability field, what it is, when it exists)
_KINDS = {
    "fp16": ("fp16_mma", "fp16 tensor-core MMA", "needs SM 7.5 or newer"),
    "bf16": ("bf16_mma", "bf16 tensor-core MMA", "needs SM 8.0 or newer"),
    "fp8": ("fp8_mma", "fp8 (e4m3/e5m2) tensor-core MMA", "needs SM 8.9 or newer"),
    "int8": ("int8_mma", "fast int8 tensor-core MMA",
             "needs SM 7.5 to 9.0 or SM 12.x (SM 10.x's tcgen05 instructions are treated as having none)"),
    "wgmma": ("wgmma", "wgmma (warpgroup MMA)", "exists on SM 9.0 (Hopper, sm_90a) only"),
    "block_scaled": ("block_scaled_mma", "block-scaled (MX/NV) tensor-core MMA", "needs SM 10.0 or newer"),
}
MMA_KINDS = tuple(_KINDS) + ("fma",)  # "fma": CUDA-core FMA (no tensor cores), available everywhere


def mma_reason(kind: str, facts: DeviceFacts | None = None) -> str | None:
    """None when ``facts`` (default: ``device_facts()``) has the MMA ``kind``, else a sentence naming the GPU and
    its SM, e.g. "bf16 tensor-core MMA needs SM 8.0 or newer; this GPU (Tesla T4) is SM 7.5"."""
    if kind == "fma":
        return None
    if kind not in _KINDS:
        raise ValueError(f"unknown MMA kind {kind!r}; expected one of {MMA_KINDS}")
    facts = facts or device_facts()
    field, what, when = _KINDS[kind]
    if getattr(capability(facts), field):
        return None
    return f"{what} {when}; this GPU ({facts.name}) is SM {facts.sm[0]}.{facts.sm[1]}"


_X_DTYPES = {"float16": "fp16", "fp16": "fp16", "half": "fp16", "bfloat16": "bf16", "bf16": "bf16",
             "float32": "fma", "fp32": "fma", "float": "fma"}


def kernel_mma_kind(act_dtype_name: str | None, x_dtype: "torch.dtype | str | None" = None) -> str:
    """The MMA kind the tiled kernels (``kernels/_dense_tiled.py: tile_matmul``, dense and grouped) need.

    ``act_dtype_name``: the scheme's activation element type (``str(scheme.act.dtype)``), None for 16-bit
    (unquantized) activations, whose dtype ``x_dtype`` (a torch dtype or "fp16"/"bf16"/"fp32") then decides:
    fp16 -> "fp16", bf16 -> "bf16" (the weight is rounded to x's dtype for the MMA); fp32 -> "fma": fp32
    activations run the tile loop's DOT_F32 branch, ``tl.dot(..., input_precision="ieee")`` in fp32, which Triton
    lowers to CUDA-core FMAs, not to a tensor-core MMA (nothing is rounded to 16 bits) -- it runs on any SM.
    e4m3 activations -> "fp8": 16-row tiles multiply on the fp8 MMA; 64/128-row tiles (ACT_KIND 5) do the MMA
    in bf16, but still convert the codes through Triton's fp8e4nv type, which only compiles from sm_89.
    int8 -> "int8".  e2m1 (W4A4) -> "bf16": codes and block scales are decoded in registers for a bf16 MMA."""
    if act_dtype_name is None:
        name = str(x_dtype).removeprefix("torch.")
        if name not in _X_DTYPES:
            raise ValueError(f"no tiled kernel for {x_dtype} activations (fp16, bf16 or fp32)")
        return _X_DTYPES[name]
    kinds = {"e4m3fn": "fp8", "e4m3": "fp8", "int8": "int8", "e2m1": "bf16"}
    if act_dtype_name not in kinds:
        raise ValueError(f"no tiled kernel for {act_dtype_name} activations (e4m3fn, int8 or e2m1)")
    return kinds[act_dtype_name]

