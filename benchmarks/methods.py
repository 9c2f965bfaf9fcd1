"""The methods a case is run with: ours (``humming_triton``) and the torch baselines (cuBLAS, ``_scaled_mm``,
``_grouped_mm``).  humming-kernels and gemlite live in peers.py.

Each ``make_*`` function returns a ``Prepared`` -- a no-argument call producing ``y`` plus the float32
reference that call must match and the tolerance -- or raises ``Skip`` with the reason that goes in the row.
Weight-side work (quantization, layer construction) is cached per (scheme, shape) in ``SchemeCtx.cache`` so it
is paid once, not once per M.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

import humming_triton as ht
import humming_triton.dispatch as ht_dispatch
from humming_triton.formats.packing import packed_words
from humming_triton.formats.weight import scale_shape, scale_storage_dtype, zero_storage_dtype

from .cases import ACT_FP8_SCHEMES

__all__ = ["Skip", "Prepared", "ShapeCtx", "SchemeCtx", "MInputs", "weight_bytes", "kernel_reason",
           "make_ours", "make_cublas", "make_scaled_mm", "make_grouped_mm", "rel_err"]

# Tolerances on the relative Frobenius error.  Ours is compared with ht's exact reference on the *same*
# quantized weight (and, for A8, the same activation codes: the quantizer rounds ties exactly as the reference
# does), so only MMA/accumulation rounding remains: 1.7e-3 - 3.1e-3 in every committed H200 row.  A8 once had
# 3e-2 here, which let a path that skipped the activation quantization (err 2.6e-2) pass unnoticed.  Peers are compared with their own dequantized weight where they expose one (looser: we check they
# compute the function, the measured error is recorded either way), else with the float weight, allowing twice
# the quantization error our own RTN makes for that format.
TOL_OURS_A16 = TOL_OURS_A8 = 1e-2
TOL_PEER_A16, TOL_PEER_A8 = 5e-2, 8e-2
TOL_BF16 = 1e-2


class Skip(Exception):
    """The method cannot run this case; str(e) is the reason recorded in the row."""


@dataclass
class Prepared:
    fn: Callable[[], torch.Tensor]
    y_ref: Callable[[], torch.Tensor]   # lazy float32 reference (computed only after fn ran)
    tol: float | Callable[[], float]   # a callable is evaluated after the call ran (it may need references)
    ref: str                            # what the output was compared with
    weight_bytes: int                   # bytes of weight (+ scales, zeros) the call must read
    peak: str = "bf16"                  # which tensor-core ceiling applies: bf16 | fp8
    scheme: str = ""                    # the scheme label of the row
    check_backend: Callable[[], str | None] | None = None  # after the first call: None or why it is invalid
    plan: Callable[[], str | None] | None = None  # after the first call: which backend/family/config ran


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y = y.reshape(ref.shape).double()
    ref = ref.double()
    return float((y - ref).norm() / ref.norm().clamp(min=1e-30))


def weight_bytes(scheme: str, n: int, k: int) -> int:
    """Bytes of one [N, K] weight in the canonical packed format (codes + scales + zeros + global scale):
    the minimum any kernel of that format must read, used for every method standing in for the scheme."""
    s = ht.QuantScheme.parse(scheme)
    b = n * packed_words(k, s.bits) * 4
    sn, sk = scale_shape(s, n, k)
    b += sn * sk * torch.empty((), dtype=scale_storage_dtype(s)).element_size()
    zdt = zero_storage_dtype(s)
    if zdt is not None:
        b += sn * sk * torch.empty((), dtype=zdt).element_size()
    if s.scale.global_scale:
        b += 4
    return b


def kernel_reason(op: str, scheme: str, dtype: torch.dtype = torch.bfloat16) -> str | None:
    """None when our Triton kernels claim support for (op, scheme), else why not (also when the kernels
    package or its ``supports`` function does not exist yet)."""
    try:
        from humming_triton.kernels import supports
    except (ImportError, AttributeError) as e:
        return f"humming_triton.kernels.supports unavailable ({type(e).__name__}: {e})"
    try:
        return supports(op, ht.QuantScheme.parse(scheme), dtype)
    except Exception as e:  # noqa: BLE001
        return f"supports() raised {type(e).__name__}: {e}"


# --- per-shape / per-scheme / per-M context ----------------------------------------------------------------

@dataclass
class MInputs:
    """Activations (and MoE routing) for one M; references are computed lazily and cached."""
    x: torch.Tensor                       # dense: [M, K]; moe: x_sorted [M*topk, K] (rows sorted by expert)
    offsets: torch.Tensor | None = None   # moe: [E+1] int32, rows offsets[e]:offsets[e+1] use expert e
    counts: list | None = None            # moe: rows per expert (host list)
    cache: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.x.shape[0]


@dataclass
class ShapeCtx:
    """A float weight ``W`` (``[N, K]`` or ``[E, N, K]``, bf16, N(0, 0.02)) shared by every scheme and method
    of one shape, and the activations of each M."""
    W: torch.Tensor
    device: str
    topk: int = 1
    seed: int = 0
    m_inputs: dict = field(default_factory=dict)

    @property
    def moe(self) -> bool:
        return self.W.dim() == 3

    def inputs(self, m: int) -> MInputs:
        if m not in self.m_inputs:
            self.m_inputs.clear()  # one M at a time: activations of M=4096 MoE are big
            g = torch.Generator(device=self.device).manual_seed(self.seed * 1000003 + m)
            k = self.W.shape[-1]
            x = torch.randn(m, k, device=self.device, dtype=torch.float32, generator=g).to(torch.bfloat16)
            if not self.moe:
                self.m_inputs[m] = MInputs(x)
            else:
                e = self.W.shape[0]
                # uniform random routing: each token picks topk distinct experts
                ids = torch.randn(m, e, device=self.device, generator=g).topk(self.topk, dim=1).indices
                flat = ids.reshape(-1)
                order = torch.sort(flat, stable=True).indices
                xs = x[order // self.topk].contiguous()
                counts = torch.bincount(flat, minlength=e)
                offsets = torch.zeros(e + 1, dtype=torch.int32, device=self.device)
                offsets[1:] = torch.cumsum(counts, 0).to(torch.int32)
                self.m_inputs[m] = MInputs(xs, offsets, counts.tolist())
        return self.m_inputs[m]

    def y_float(self, mi: MInputs) -> torch.Tensor:
        """x @ W.T in float32 with the unquantized weight."""
        if "y_float" not in mi.cache:
            mi.cache["y_float"] = self.apply_weight(mi, self.W)
        return mi.cache["y_float"]

    def apply_weight(self, mi: MInputs, w: torch.Tensor) -> torch.Tensor:
        """float32 ``x @ w.T`` (dense) or the grouped product with expert weights ``w [E, N, K]``."""
        xf = mi.x.float()
        if w.dim() == 2:
            return xf @ w.float().T
        y = torch.zeros(mi.rows, w.shape[1], device=xf.device, dtype=torch.float32)
        o = mi.offsets.tolist()
        for e in range(w.shape[0]):
            if o[e + 1] > o[e]:
                y[o[e]:o[e + 1]] = xf[o[e]:o[e + 1]] @ w[e].float().T
        return y

    def touched_experts(self, mi: MInputs) -> int:
        return sum(1 for c in mi.counts if c) if self.moe else 1


@dataclass
class SchemeCtx:
    scheme: str
    shape: ShapeCtx
    cache: dict = field(default_factory=dict)

    @property
    def N(self) -> int:
        return self.shape.W.shape[-2]

    @property
    def K(self) -> int:
        return self.shape.W.shape[-1]

    def qw(self):
        """Our quantized weight (canonical QuantWeight), made once."""
        if "qw" not in self.cache:
            self.cache["qw"] = ht.quantize_weight(self.shape.W, self.scheme)
        return self.cache["qw"]

    def ours_ref(self, mi: MInputs) -> torch.Tensor:
        key = ("ours_ref", self.scheme)
        if key not in mi.cache:
            qw = self.qw()
            if self.shape.moe:
                mi.cache[key] = ht.reference_grouped_linear(mi.x, qw, mi.offsets, out_dtype=torch.float32)
            else:
                mi.cache[key] = ht.reference_linear(mi.x, qw, out_dtype=torch.float32)
        return mi.cache[key]

    def float_tol(self, mi: MInputs) -> float:
        """Tolerance vs the float weight for a peer of this scheme: twice our own RTN error, plus slack."""
        q = rel_err(self.ours_ref(mi), self.shape.y_float(mi))
        return 2 * q + 0.03

    def wbytes(self, mi: MInputs) -> int:
        return weight_bytes(self.scheme, self.N, self.K) * self.shape.touched_experts(mi)


# --- ours --------------------------------------------------------------------------------------------------

def make_ours(sc: SchemeCtx, mi: MInputs, backend: str, invariant: bool = False) -> Prepared:
    """``ht.quant_linear`` (dense) / ``ht.grouped_linear`` (MoE).  The reference backend is never timed on a
    GPU (it is a float32 dequantize-and-matmul, not a kernel): ``backend='reference'`` is a CPU debug flag.
    ``invariant``: the same call in batch-invariant mode (``ht.batch_invariant()``), for the mode's cost."""
    scheme = sc.scheme
    act8 = ht.QuantScheme.parse(scheme).act is not None
    op = "grouped_linear" if sc.shape.moe else "quant_linear"
    if backend != "reference":
        why = kernel_reason(op, scheme)
        if why:
            raise Skip(f"no Triton kernel: {why}")
    qw = sc.qw()
    x = mi.x
    if sc.shape.moe:  # auto: the measured table's choice (Triton grouped GEMM or dequantize + grouped_mm)
        fn = lambda: ht.grouped_linear(x, qw, mi.offsets, backend=backend)  # noqa: E731
    else:
        fn = lambda: ht.quant_linear(x, qw, backend=backend)  # noqa: E731
    if invariant:
        plain = fn

        def fn():
            with ht.batch_invariant():
                return plain()

    def check_backend():
        # "triton" and the torch-composed "torch" backend (dequantize + cuBLAS) are real candidates the
        # dispatcher may pick; only the float32 reference is not a kernel and must not be timed as ours
        got = ht.last_backend(op)
        if backend != "reference" and got == "reference":
            return "ran on the 'reference' backend (the float32 oracle, not a kernel; not timed)"
        return None

    def plan():
        # humming_triton.dispatch.last_plan is newer than this harness: None until it exists
        last_plan = getattr(ht_dispatch, "last_plan", None)
        return last_plan(op) if last_plan is not None else None

    return Prepared(fn, lambda: sc.ours_ref(mi), TOL_OURS_A8 if act8 else TOL_OURS_A16,
                    "ht.reference (same quantized weight)", sc.wbytes(mi),
                    "fp8" if scheme in ACT_FP8_SCHEMES else "bf16", scheme, check_backend, plan)


# --- torch baselines ---------------------------------------------------------------------------------------

def make_cublas(shape: ShapeCtx, mi: MInputs) -> Prepared:
    """bf16 ``F.linear`` on the unquantized weight: the baseline every quantized format must beat.  (On CPU,
    in the smoke mode, it is torch's CPU matmul -- the row keeps the name for schema stability.)"""
    w, x = shape.W, mi.x
    return Prepared(lambda: F.linear(x, w), lambda: shape.y_float(mi), TOL_BF16, "float32 x@W.T",
                    w.numel() * 2, "bf16", "bf16")


def _fp8_rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (per-token / per-channel) e4m3 quantization: (codes, fp32 scales [rows, 1])."""
    amax = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    s = amax / 448.0
    return (t.float() / s).to(torch.float8_e4m3fn), s


def make_scaled_mm(sc: SchemeCtx, mi: MInputs) -> Prepared:
    """fp8 x fp8 through cuBLASLt, row-wise scales; the activation quantization (eager torch ops) is inside
    the timed call, as a serving engine would pay it."""
    if not hasattr(torch, "_scaled_mm"):
        raise Skip("torch._scaled_mm not available")
    if "scaled_mm_w" not in sc.cache:
        wq, ws = _fp8_rowwise(sc.shape.W)
        sc.cache["scaled_mm_w"] = (wq, ws.reshape(1, -1).contiguous())
    wq, ws = sc.cache["scaled_mm_w"]
    x = mi.x

    def fn():
        xq, xs = _fp8_rowwise(x)
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)

    # the tolerance is twice the error our own w8a8-fp8 RTN makes on this weight (fp8 rounding of x and W)
    ref_sc = sc if sc.scheme == "w8a8-fp8" else SchemeCtx("w8a8-fp8", sc.shape, sc.cache.setdefault("w8a8", {}))
    n, k = sc.N, sc.K
    return Prepared(fn, lambda: sc.shape.y_float(mi), lambda: ref_sc.float_tol(mi), "float32 x@W.T",
                    n * k + n * 4, "fp8", "w8a8-fp8")


def make_grouped_mm(shape: ShapeCtx, mi: MInputs) -> Prepared:
    """bf16 ``torch._grouped_mm``: 2-D routed rows x 3-D expert weights; ``offs`` are int32 cumulative row
    ends per expert ([E]), mat_b is ``[E, K, N]`` (the transposed view of ``[E, N, K]``)."""
    if not hasattr(torch, "_grouped_mm"):
        raise Skip("torch._grouped_mm not available")
    wt = shape.W.transpose(-2, -1)
    ends = mi.offsets[1:].contiguous()
    x = mi.x
    e, n, k = shape.W.shape
    return Prepared(lambda: torch._grouped_mm(x, wt, offs=ends), lambda: shape.y_float(mi), TOL_BF16,
                    "float32 grouped x@W.T", shape.touched_experts(mi) * n * k * 2, "bf16", "bf16")
