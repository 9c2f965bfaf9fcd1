"""The native decode GEMM for M <= 16 (``csrc/decode_mma.cu``): its weight layout, its launch, and a pure-torch
model of what it computes.

``repack(qw)`` turns a canonical QuantWeight (kpack32) into the kernel's layout once (cached on the weight by the
backend): the codes (integers as unsigned offsets, e4m3 / e2m1 as they are) in mma-fragment order, 16 bytes per
thread per 64 K, and the scales /
zero points as fp32 pairs (row g, row g + 8) per 16-row tile and scale group.  ``emulate`` replays the kernel's
arithmetic fragment by fragment on any device, from the repacked tensors alone: the CPU tests prove the layout and
the fragment mapping against the reference without a GPU.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from .native import DecodeCall, check, current_stream, library

__all__ = ["Packed", "weight_reason", "repack", "repack_experts", "run", "runner", "grouped_runner", "run_grouped",
           "emulate", "CHUNK", "MAX_M"]

CHUNK = 64      # K per 16-byte load of int4 codes (one 64-wide chunk: four k16 mma steps)
MAX_M = 16      # two n-tiles of 8 tokens
MAX_THREADS = 512


FP4_KINDS = {("e8m0", 32, False): 40, ("e4m3fn", 16, True): 41}  # (scale type, group, global scale) -> kind
E4M3 = 18  # e4m3 weights: 8-bit codes in the int8 layout, converted by cvt.rn.f16x2.e4m3x2 (fp16 activations, sm_89+)


def fp4_kind(scheme) -> int | None:
    """40 (MXFP4: e2m1 with e8m0 scales per 32) / 41 (NVFP4: e4m3 per 16 and a global scale), else None."""
    w, sc = scheme.weight, scheme.scale
    if str(w) != "e2m1" or (sc.block_n or 0) != 1:
        return None
    return FP4_KINDS.get((str(sc.dtype), sc.block_k, bool(sc.global_scale)))


def weight_reason(scheme, n: int, k: int, dtype=None, act_codes: bool = False) -> str | None:
    """Why the kernel cannot take this weight format / shape (None if it can); ``dtype``: the activations'.
    ``act_codes``: the activations are a quantized-activation scheme's codes as 16-bit values (their scale is the
    caller's), so only the weight half of the scheme counts."""
    from humming_triton.formats.dtypes import IntType, WideFloat
    w, sc = scheme.weight, scheme.scale
    if scheme.act is not None and not act_codes:
        return f"{scheme.name} quantizes its activations (this kernel takes 16-bit activations)"
    if str(w) == "e2m1":
        if fp4_kind(scheme) is None:
            return f"e2m1 with {sc} scales (MXFP4 e8m0:g32 and NVFP4 e4m3fn:g16+global only)"
        if dtype is not None and dtype != torch.bfloat16:
            return f"e2m1 weights with {dtype} activations (bf16 only: block scales can leave fp16's range)"
        return None if k % 16 == 0 else f"K={k} is not a multiple of 16"
    if str(w) == "e4m3fn":
        if dtype is not None and dtype != torch.float16:
            return f"e4m3 weights with {dtype} activations (fp16 only: e4m3 converts to fp16 in one instruction)"
    elif not isinstance(w, IntType) or w.bits not in (4, 8):
        return f"weight type {w} (the native decode kernel takes int4 / int8 / e4m3 codes and MX / NV e2m1)"
    if scheme.zero == "float":
        return "float zero points (128 + z must be exact in the 16-bit activation type)"
    if not isinstance(sc.dtype, WideFloat) or sc.global_scale:
        return f"{sc.dtype} scales (the native decode kernel takes fp16 / bf16 / fp32 scales)"
    gk = scheme.group_k(k)
    if gk != k and gk % CHUNK:
        return f"scale group {gk} (groups of a multiple of {CHUNK} only, or one per row)"
    if gk != k and k % gk:
        return f"K={k} is not a multiple of the scale group {gk} (a partial last block)"
    if k % 16:
        return f"K={k} is not a multiple of 16"
    return None


@dataclass
class Packed:
    """The kernel's view of one weight (2-D)."""
    w: torch.Tensor          # int32 [tiles, chunks, loads, 32, 4]
    scales: torch.Tensor     # fp32 [tiles, groups, 8, 2]
    zeros: torch.Tensor | None  # fp32 like scales (the zero point per row), None: 2^(bits-1)
    bits: int                # 4 / 8; 18: e4m3; e2m1 kinds: 40 (MX), 41 (NV)
    n: int
    k: int
    group_chunks: int        # 0: one scale per row (and every e2m1 kind: its scales travel in fp4_scales)
    groups: int
    fp4_scales: torch.Tensor | None = None  # uint8 [tiles, chunks, 32, 2]: block-scale codes of rows g, g + 8
    out_scale: float = 1.0   # the NVFP4 global scale
    out_scales: torch.Tensor | None = None  # experts: fp32 [E] global scales (NVFP4), else None

    @property
    def code_bits(self) -> int:
        return 4 if self.bits >= 40 else 8 if self.bits == E4M3 else self.bits

    @property
    def chunks(self) -> int:
        return self.w.shape[-4]

    @property
    def experts(self) -> int:
        return self.w.shape[0] if self.w.dim() == 6 else 0

    def expert(self, e: int) -> "Packed":
        """Expert ``e`` of a stacked (MoE) view, as a dense view."""
        from dataclasses import replace
        return replace(self, w=self.w[e], scales=self.scales[e], zeros=None if self.zeros is None else self.zeros[e],
                       fp4_scales=None if self.fp4_scales is None else self.fp4_scales[e],
                       out_scale=1.0 if self.out_scales is None else float(self.out_scales[e]), out_scales=None)


@dataclass(frozen=True)
class NativeLaunch:
    """A planned launch for a host path outside Python (``cutlass_ext.native_op``): the prepared launch struct,
    where x / y / stream / bias / the expert offsets sit in it (byte offsets; -1: no offsets, a dense launch), the
    entry point that takes it (``int f(const void*)``, 0 on
    success) and the one naming an error code (``const char* f(int)``, or 0), the output's shape and dtype, and the
    tensors the struct points into (held with it)."""
    call: bytes
    offsets: tuple
    launch: int
    error_string: int
    out_shape: tuple
    out_dtype: torch.dtype
    keep: tuple
    weight_bias: bool = False  # without a bias argument the launch reads the weight's own (wbias), patched per call


def _packed_tensors(p: Packed) -> tuple:
    return tuple(t for t in (p.w, p.scales, p.zeros, p.fp4_scales, p.out_scales) if t is not None)


def _fragment_map(bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For every code a thread holds -- [loads, lane, word, field] -- its row in the 16-row tile and its k in the
    64-wide chunk, and the bit position of its field in the word.

    int4 (one load): word s is mma step s; nibble p < 4 is the low half of A register p, nibble p + 4 its high
    half; register p holds row g + 8 (p % 2), k = 16 t + 4 s + 2 (p // 2) + half.
    int8 (two loads): load h holds steps 2h, 2h + 1; word i of it is step 2h + i // 2, row g + 8 (i % 2), and its
    byte b is k = 16 t + 4 s + b.  (g = lane // 4, t = lane % 4; csrc/decode_mma.cu explains the k permutation.)"""
    lane = torch.arange(32)
    g, t = lane // 4, lane % 4
    if bits == 4:
        s = torch.arange(4).view(1, 1, 4, 1)
        p = torch.arange(8).view(1, 1, 1, 8)
        reg, half = p % 4, p // 4
        row = g.view(1, 32, 1, 1) + 8 * (reg % 2)
        k = 16 * t.view(1, 32, 1, 1) + 4 * s + 2 * (reg // 2) + half
        shift = 4 * p
    else:
        h = torch.arange(2).view(2, 1, 1, 1)
        i = torch.arange(4).view(1, 1, 4, 1)
        b = torch.arange(4).view(1, 1, 1, 4)
        s = 2 * h + i // 2
        row = g.view(1, 32, 1, 1) + 8 * (i % 2)
        k = 16 * t.view(1, 32, 1, 1) + 4 * s + b
        shift = 8 * b
    shape = torch.broadcast_shapes(row.shape, k.shape, shift.shape)
    return row.expand(shape), k.expand(shape), shift.expand(shape)


def _pairs(t: torch.Tensor, tiles: int, fill: float = 0.0) -> torch.Tensor:
    """[N, G] per-row values -> [tiles, G, 8, 2]: (row g, row g + 8) of each 16-row tile (``fill`` past N)."""
    n, groups = t.shape
    padded = t.new_full((tiles * 16, groups), fill)
    padded[:n] = t
    return padded.view(tiles, 2, 8, groups).permute(0, 3, 2, 1).contiguous()


_TILES_PER_STEP = 256  # repack this many 16-row tiles at a time (bounds the int64 temporaries)


def repack(qw, group_k: int | None = None) -> Packed:
    """The kernel's layout of a 2-D canonical QuantWeight, made on the weight's device (once per weight).  Scales
    travel one per row and group of K (2-D blocks repeat over their rows, exactly); ``group_k``: groups of that
    many K instead of the weight's own (which it must divide, or the weight has one scale per row) -- for
    activations whose scales change every ``group_k``."""
    from humming_triton.formats.packing import unpack_codes
    from humming_triton.formats.weight import decode_scales
    why = weight_reason(qw.scheme, qw.N, qw.K, act_codes=True)  # the weight alone: the caller feeds activations
    if why or qw.data.dim() != 2:
        raise ValueError(f"the native decode kernel cannot take this weight: {why or 'a 3-D (expert) weight'}")
    bits, n, k = qw.scheme.bits, qw.N, qw.K
    kind = fp4_kind(qw.scheme)
    e4m3 = str(qw.scheme.weight) == "e4m3fn"
    tiles, chunks = -(-n // 16), -(-k // CHUNK)
    codes = unpack_codes(qw.data, bits, k)
    if kind is None and not e4m3 and qw.scheme.weight.signed:  # two's complement -> unsigned u = v + 2^(bits-1)
        codes = codes ^ (1 << (bits - 1))
    row, kk, shift = (a.to(qw.device) for a in _fragment_map(4 if kind else bits))
    loads, words = row.shape[0], row.shape[2]
    out = torch.empty(tiles, chunks, loads, 32, 4, dtype=torch.int32, device=qw.device)
    for t0 in range(0, tiles, _TILES_PER_STEP):
        t1 = min(tiles, t0 + _TILES_PER_STEP)
        block = torch.zeros((t1 - t0) * 16, chunks * CHUNK, dtype=torch.int64, device=qw.device)
        rows = codes[t0 * 16:min(n, t1 * 16)]
        block[:rows.shape[0], :k] = rows
        # [tiles, 16, chunks, 64] -> [tiles, chunks, 16, 64] -> gather each field -> OR the fields of a word
        block = block.view(t1 - t0, 16, chunks, CHUNK).transpose(1, 2)
        fields = block[:, :, row, kk] << shift
        word = fields.sum(-1)  # fields never overlap: the sum is the OR
        out[t0:t1] = torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32).view(
            t1 - t0, chunks, loads, 32, words)
    if kind is not None:
        j = fp4_row_exponents(qw)
        return Packed(out, _pairs(j.exp2()[:, None], tiles, 1.0), None, kind, n, k, 0, 1,
                      _fp4_scale_codes(qw, tiles, chunks, j), float(qw.global_scale) if qw.global_scale is not None
                      else 1.0)
    gk = qw.scheme.group_k(k)
    rows = decode_scales(qw.scales, qw.scheme).float().repeat_interleave(qw.scheme.group_n(n), 0)[:n]
    zrows = None if qw.zeros is None else qw.zeros.float().repeat_interleave(qw.scheme.group_n(n), 0)[:n]
    if group_k is not None and group_k != gk:
        if gk % group_k or group_k % CHUNK or k % group_k:
            raise ValueError(f"scale groups of {group_k} do not divide the weight's ({gk}) and K={k} into chunks "
                             f"of {CHUNK}")
        rows = rows.repeat_interleave(gk // group_k, 1)
        zrows = None if zrows is None else zrows.repeat_interleave(gk // group_k, 1)
        gk = group_k
    groups = 1 if gk == k else k // gk
    scales = _pairs(rows.reshape(n, groups), tiles)
    zeros = None if zrows is None else _pairs(zrows.reshape(n, groups), tiles)
    return Packed(out, scales, zeros, E4M3 if e4m3 else bits, n, k, 0 if groups == 1 else gk // CHUNK, groups)


def fp4_row_exponents(qw) -> torch.Tensor:
    """[N] fp32 j per row: the kernel multiplies block scales by 2^(126 - j), so that with its e2m1 decode (the
    value times 2^-126) one bf16 multiply makes value x scale x 2^-j, and the fp32 result by 2^j.  e8m0: j from the
    row's largest finite scale code s (2^(s - 1 - j) <= 2^127: j = s - 128), so the largest products are normal and
    any block within 2^126 of it exact; e4m3 (2^-9 .. 448): j = 16 for every row."""
    if str(qw.scheme.scale.dtype) != "e8m0":
        return torch.full((qw.N,), 16.0, device=qw.device)
    codes = qw.scales.to(torch.int32)
    finite = torch.where(codes == 255, torch.zeros_like(codes), codes)  # 255 is NaN: it decodes to inf regardless
    return (finite.amax(1) - 128).clamp(-126, 126).float()


_ONE = {"e8m0": 127, "e4m3fn": 0x38}  # the code of 1.0: padding (a NaN scale times a zero code is still NaN)


def _fp4_scale_codes(qw, tiles: int, chunks: int, j: torch.Tensor) -> torch.Tensor:
    """[tiles, chunks, 32, 2] uint8: lane (g, t) of chunk c holds k in [64 c + 16 t, +16) -- one block of 16 or
    32 -- and needs that block's scale codes for rows g and g + 8 (e8m0: offset by 126 - j of the row, clamped to
    0..255, so that the code is the bf16 exponent field of the folded scale; e4m3: as they are)."""
    n, gk = qw.N, qw.scheme.scale.block_k
    codes = torch.full((tiles * 16, chunks * CHUNK // gk), _ONE[str(qw.scheme.scale.dtype)], dtype=torch.uint8,
                       device=qw.device)
    real = qw.scales
    if str(qw.scheme.scale.dtype) == "e8m0":  # as the bf16 exponent field of scale x 2^(126 - j), j per row
        d = 126 - j.long()  # j: fp4_row_exponents (padding keeps 127: a finite scale of zero codes)
        real = (real.long() + d[:, None]).clamp(0, 255).to(torch.uint8)
    codes[:n, :qw.scales.shape[-1]] = real
    lane = torch.arange(32, device=qw.device)
    g, t = lane // 4, lane % 4
    c = torch.arange(chunks, device=qw.device).view(-1, 1)
    blk = (CHUNK * c + 16 * t) // gk                     # [chunks, 32]
    rows = torch.arange(tiles, device=qw.device).view(-1, 1, 1) * 16 + g  # [tiles, 1, 32]
    lo, hi = codes[rows, blk[None]], codes[rows + 8, blk[None]]
    return torch.stack([lo, hi], -1).contiguous()


def repack_experts(qw) -> Packed:
    """The kernel's layout of a 3-D (MoE) QuantWeight: every expert repacked, stacked expert-major."""
    from dataclasses import replace
    if qw.data.dim() != 3:
        raise ValueError("repack_experts takes a 3-D (expert) weight; use repack for a dense one")
    if qw.k_perm is not None:
        raise ValueError("the native decode kernel cannot take act-order (k_perm) experts")
    parts = []
    for e in range(qw.num_experts):
        one = replace(qw, data=qw.data[e], scales=qw.scales[e], zeros=None if qw.zeros is None else qw.zeros[e],
                      global_scale=None if qw.global_scale is None else qw.global_scale[e], shape=qw.shape[1:],
                      bias=None, cache={})
        parts.append(repack(one))
    first = parts[0]
    stack = lambda name: None if getattr(first, name) is None else torch.stack([getattr(q, name) for q in parts])  # noqa: E731
    gs = None if qw.global_scale is None else qw.global_scale.float().reshape(-1).contiguous()
    return replace(first, w=stack("w"), scales=stack("scales"), zeros=stack("zeros"), fp4_scales=stack("fp4_scales"),
                   out_scale=1.0, out_scales=gs)


def split(p: Packed, kw: int) -> int:
    """Chunks per warp when ``kw`` warps split K (whole scale groups each)."""
    if p.group_chunks == 0:
        return -(-p.chunks // kw)
    return -(-p.groups // kw) * p.group_chunks


_DTYPES = {torch.float16: 0, torch.bfloat16: 1}
_OUT_DTYPES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}  # bias / out


def _check(x2: torch.Tensor, out: torch.Tensor, kw: int, tw: int, row_scales=None, act_scales=None, p=None) -> None:
    if x2.dtype not in _DTYPES:
        raise TypeError(f"the native decode kernel takes fp16 / bf16 activations, got {x2.dtype}")
    if x2.stride(-1) != 1 or x2.stride(0) % 8 or x2.data_ptr() % 16:
        raise ValueError("x rows must be contiguous and 16-byte aligned")
    if out.dtype not in _OUT_DTYPES or out.stride(-1) != 1:
        raise ValueError(f"out must be fp16 / bf16 / fp32 with unit column stride, got {out.dtype}")
    if row_scales is not None and (row_scales.dtype != torch.float32 or row_scales.numel() != x2.shape[0]
                                   or not row_scales.is_contiguous() or row_scales.device != x2.device):
        raise ValueError(f"row_scales must be {x2.shape[0]} contiguous fp32 values on {x2.device}")
    if act_scales is not None:
        if p.group_chunks == 0 or p.code_bits != 8 or x2.dtype != torch.float16 or p.zeros is not None:
            raise ValueError("act_scales need int8 / e4m3 weights without zero points, repacked with group scales, "
                             "and fp16 codes")
        if act_scales.dtype != torch.float32 or act_scales.shape != (x2.shape[0], p.groups) or \
                not act_scales.is_contiguous() or act_scales.device != x2.device:
            raise ValueError(f"act_scales must be contiguous fp32 [{x2.shape[0]}, {p.groups}] on {x2.device}")
    if 32 * kw * tw > MAX_THREADS:
        raise ValueError(f"{kw} x {tw} warps exceed {MAX_THREADS} threads per block")


def _call_template(p: Packed, device: int, dtype, bias_dtype, out_dtype, kw, tw, unroll, m, out_scale,
                   offsets_i64: bool) -> DecodeCall:
    """What a launch of ``p`` with these settings passes whatever the activations: made once per setting and
    weight storage (cached on ``p``), copied per call with the activations' pointers filled in."""
    key = (device, dtype, bias_dtype, out_dtype, kw, tw, unroll, m, out_scale, offsets_i64, p.w.data_ptr(),
           p.scales.data_ptr(), None if p.zeros is None else p.zeros.data_ptr(),
           None if p.fp4_scales is None else p.fp4_scales.data_ptr(),
           None if p.out_scales is None else p.out_scales.data_ptr())
    cache = p.__dict__.setdefault("_calls", {})
    call = cache.get(key)
    if call is None:
        ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
        call = DecodeCall(
            device=device, dtype=_DTYPES[dtype], bits=p.bits, zero=int(p.zeros is not None), unroll=unroll, kw=kw,
            tw=tw, w=ptr(p.w), scales=ptr(p.scales), zeros=ptr(p.zeros), fp4_scales=ptr(p.fp4_scales),
            bias_dtype=0 if bias_dtype is None else _OUT_DTYPES[bias_dtype], out_dtype=_OUT_DTYPES[out_dtype],
            M=m, N=p.n, K=p.k, group_chunks=p.group_chunks, groups=p.groups, chunks_per_warp=split(p, kw),
            out_scale=out_scale * p.out_scale, offsets_i64=int(offsets_i64), experts=max(1, p.experts),
            out_scales=ptr(p.out_scales))
        cache[key] = call
    return call


# run_grouped's grids: HtDecodeCall.grid
GRIDS = {"experts": 0, "rows": 1, "passes": 2}


def _launch(x2, p: Packed, bias, out, kw, tw, unroll, m, out_scale, offsets=None, row_scales=None,
            act_scales=None, grid: str = "experts") -> torch.Tensor:
    if bias is not None and bias.dtype not in _OUT_DTYPES:
        bias = bias.float()
    if p.bits == E4M3 and x2.dtype != torch.float16:
        raise TypeError(f"e4m3 weights take fp16 activations, got {x2.dtype}")
    dev = x2.device
    device = dev.index if dev.index is not None else torch.cuda.current_device()
    # a copy per call: ctypes releases the GIL during the call, so a shared struct could change under it
    call = DecodeCall.from_buffer_copy(_call_template(
        p, device, x2.dtype, None if bias is None else bias.dtype, out.dtype, kw, tw, unroll, m, out_scale,
        offsets is not None and offsets.dtype == torch.int64))
    call.x, call.y, call.ldx, call.ldy = x2.data_ptr(), out.data_ptr(), x2.stride(0), out.stride(0)
    if bias is not None:
        call.bias = bias.data_ptr()
    if row_scales is not None:
        call.row_scales = row_scales.data_ptr()
    if act_scales is not None:
        call.act_scales, call.act_ld = act_scales.data_ptr(), act_scales.shape[1]
    if offsets is not None:
        call.offsets, call.routed_rows, call.grid = offsets.data_ptr(), x2.shape[0], GRIDS[grid]
    call.stream = current_stream(dev)
    check(library().ht_decode_mma(ctypes.byref(call)), "the native decode kernel")
    return out


def run(x2: torch.Tensor, p: Packed, bias: torch.Tensor | None, out: torch.Tensor, kw: int = 8, tw: int = 1,
        unroll: int = 1, out_scale: float = 1.0, row_scales: torch.Tensor | None = None,
        act_scales: torch.Tensor | None = None) -> torch.Tensor:
    """``out[M, N] = row_scales[:, None] * (x2[M, K] @ W^T) (+ bias)`` on torch's current stream.  ``x2``:
    contiguous rows, fp16 / bf16, 16-byte aligned; ``out``: fp16 / bf16 / fp32, unit column stride;
    ``row_scales``: fp32 [M] (a per-token activation scale) or None; ``act_scales``: fp32 [M, groups], the scale
    of x2's codes per token and weight scale group (int8 / e4m3 weights, fp16 codes) or None."""
    m = x2.shape[0]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"the native decode kernel takes 1..{MAX_M} rows, got {m}")
    if p.experts:
        raise ValueError("a stacked (expert) view runs through run_grouped")
    _check(x2, out, kw, tw, row_scales, act_scales, p)
    return _launch(x2, p, bias, out, kw, tw, unroll, m, out_scale, row_scales=row_scales, act_scales=act_scales)


def _raw_stream(device: torch.device):
    """() -> the device's current stream handle, the cheapest way this torch has."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return (lambda: raw_stream(index)) if raw_stream is not None else (lambda: current_stream(device))  # noqa: E731


def _native_launch(template: DecodeCall, shape: tuple, out_dtype: torch.dtype, keep: tuple, grouped: bool,
                   weight_bias: bool = False) -> NativeLaunch:
    offsets = DecodeCall.offsets.offset if grouped else -1
    return NativeLaunch(
        bytes(template),
        (DecodeCall.x.offset, DecodeCall.y.offset, DecodeCall.stream.offset, DecodeCall.bias.offset, offsets),
        ctypes.cast(library().ht_decode_mma, ctypes.c_void_p).value,
        ctypes.cast(library().ht_error_string, ctypes.c_void_p).value, tuple(shape), out_dtype, keep, weight_bias)


def _lean_bias_ok(bias: torch.Tensor | None) -> bool:
    return bias is None or (bias.dtype in _OUT_DTYPES and bias.is_contiguous())


def runner(p: Packed, dtype: torch.dtype, device: torch.device, m: int, bias: torch.Tensor | None,
           out_dtype: torch.dtype, shape: tuple, kw: int, tw: int, unroll: int):
    """``run`` bound to one call signature, for a call plan (``humming_triton.plans``): ``(x, bias) -> y`` for a
    contiguous ``x`` of ``m`` rows of K in ``dtype`` and a bias like ``bias`` (same dtype, or None as it is None);
    per call only the output of ``shape``, the pointers and the launch.  The runner returns None for an ``x`` whose
    data is not 16-byte aligned (the full path copies it).  None: no lean form for this signature."""
    if p.experts or not 1 <= m <= MAX_M or out_dtype not in _OUT_DTYPES or 32 * kw * tw > MAX_THREADS or \
            dtype not in _DTYPES or not _lean_bias_ok(bias) or p.k % 8:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    template = DecodeCall.from_buffer_copy(_call_template(
        p, index, dtype, None if bias is None else bias.dtype, out_dtype, kw, tw, unroll, m, 1.0, False))
    template.ldx, template.ldy = p.k, p.n
    launch, copy, by_ref, stream = library().ht_decode_mma, DecodeCall.from_buffer_copy, ctypes.byref, \
        _raw_stream(device)

    def run_planned(x: torch.Tensor, bias: torch.Tensor | None):
        ptr = x.data_ptr()
        if ptr % 16 or not x.is_contiguous():
            return None
        y = torch.empty(shape, dtype=out_dtype, device=device)
        call = copy(template)  # a copy per call: ctypes releases the GIL during the call
        call.x, call.y, call.stream = ptr, y.data_ptr(), stream()
        if bias is not None:
            call.bias = bias.data_ptr()
        err = launch(by_ref(call))
        if err:
            check(err, "the native decode kernel")
        return y
    run_planned.packed = p  # the template points into it: held as long as the runner is
    run_planned.native = _native_launch(template, shape, out_dtype, _packed_tensors(p), grouped=False)
    return run_planned


def grouped_runner(p: Packed, dtype: torch.dtype, device: torch.device, rows: int, offsets_dtype: torch.dtype,
                   bias: torch.Tensor | None, fixed_bias: torch.Tensor | None, out_dtype: torch.dtype, kw: int,
                   tw: int, unroll: int, rows_per_pass: int, grid: str):
    """``run_grouped`` bound to one call signature, for a call plan: ``(x, offsets, bias) -> y [rows, N]`` for a
    contiguous, 16-byte aligned ``x`` of ``rows`` routed rows on ``device``, 1-D ``offsets`` of ``offsets_dtype``
    on ``device``, and a bias like ``bias`` ([E, N], same dtype, or None as it is None; None runs ``fixed_bias``,
    the weight's own bias, whose pointer is read per call: ``t.data = other`` keeps the tensor but not its
    memory).  Per call only the output, the pointers and the launch; returns None for arguments it was not made
    for (the full path checks them).  None: no lean form for this signature (run_grouped's argument rules)."""
    if not p.experts or rows < 1 or out_dtype not in _OUT_DTYPES or 32 * kw * tw > MAX_THREADS or \
            dtype not in _DTYPES or offsets_dtype not in (torch.int32, torch.int64) or p.k % 8 or \
            rows_per_pass not in (8, 16, 32) or (rows_per_pass == 32 and unroll > 2) or grid not in GRIDS or \
            (grid == "rows" and rows_per_pass != 8) or (bias is not None and fixed_bias is not None) or \
            not _lean_bias_ok(bias) or not _lean_bias_ok(fixed_bias):
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    given = bias if bias is not None else fixed_bias
    template = DecodeCall.from_buffer_copy(_call_template(
        p, index, dtype, None if given is None else given.dtype, out_dtype, kw, tw, unroll, rows_per_pass, 1.0,
        offsets_dtype == torch.int64))
    template.ldx, template.ldy, template.routed_rows, template.grid = p.k, p.n, rows, GRIDS[grid]
    launch, copy, by_ref, stream = library().ht_decode_mma, DecodeCall.from_buffer_copy, ctypes.byref, \
        _raw_stream(device)
    shape, experts = (rows, p.n), p.experts + 1
    fixed, fixed_dtype = fixed_bias, None if fixed_bias is None else fixed_bias.dtype

    def run_planned(x: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None):
        ptr = x.data_ptr()
        if ptr % 16 or not x.is_contiguous() or x.device != device or offsets.dtype != offsets_dtype or \
                offsets.dim() != 1 or offsets.numel() != experts or not offsets.is_contiguous() or \
                offsets.device != device:
            return None
        if bias is None and fixed is not None:
            if fixed.dtype != fixed_dtype or not fixed.is_contiguous():
                return None
            bias = fixed
        y = torch.empty(shape, dtype=out_dtype, device=device)
        call = copy(template)
        call.x, call.y, call.offsets, call.stream = ptr, y.data_ptr(), offsets.data_ptr(), stream()
        if bias is not None:
            call.bias = bias.data_ptr()
        err = launch(by_ref(call))
        if err:
            check(err, "the native grouped decode kernel")
        return y
    run_planned.packed = p
    run_planned.native = _native_launch(template, shape, out_dtype, _packed_tensors(p), grouped=True,
                                        weight_bias=fixed is not None)
    return run_planned


def run_grouped(x2: torch.Tensor, p: Packed, offsets: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                kw: int = 4, tw: int = 1, unroll: int = 1, rows_per_pass: int = 8,
                row_scales: torch.Tensor | None = None, grid: str = "experts") -> torch.Tensor:
    """``out[r] = row_scales[r] * (x2[r] @ W[e]^T) (+ bias[e])`` for ``offsets[e] <= r < offsets[e + 1]`` (rows
    sorted by expert; offsets int32 / int64 on the device, never read on the host; ``row_scales``: fp32 [rows], a
    per-token activation scale, or None).  An expert's rows run ``rows_per_pass`` (8, 16 or 32) at a time -- 32
    (four token tiles) with ``unroll`` 1 or 2 only.  ``grid``, the launch's CTA rows (the same result each way):
    "experts", one per expert, running all its passes (experts without rows cost one empty CTA each); "rows", with
    fewer rows than experts, one per row of ``x2``, each running the expert whose rows start there (no empty
    CTAs); "passes", one per pass of every expert's passes (a bound of them: rows / rows_per_pass + min(experts,
    rows), the rest leave at once), each running one pass -- no loop around the tile, whose register bound then
    holds without spills (decode_mma.cu's GRID_PASSES)."""
    if not p.experts:
        raise ValueError("run_grouped takes a stacked (expert) view (repack_experts)")
    if rows_per_pass not in (8, 16, 32):
        raise ValueError(f"rows_per_pass must be 8, 16 or 32, got {rows_per_pass}")
    if rows_per_pass == 32 and unroll > 2:
        raise ValueError(f"32 rows per pass take unroll 1 or 2 (registers), got {unroll}")
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {sorted(GRIDS)}, got {grid!r}")
    if grid == "rows" and rows_per_pass != 8:
        raise ValueError(f"the row grid runs 8 rows per pass (one token tile), got {rows_per_pass}")
    if offsets.dtype not in (torch.int32, torch.int64) or offsets.numel() != p.experts + 1 or \
            offsets.device != x2.device:
        raise ValueError(f"offsets must be {p.experts + 1} int32 / int64 row offsets on {x2.device}")
    _check(x2, out, kw, tw, row_scales)
    if x2.shape[0] == 0:
        return out
    bias = None if bias is None else bias.contiguous()  # [E, N], expert-major
    return _launch(x2, p, bias, out, kw, tw, unroll, rows_per_pass, 1.0, offsets.contiguous(), row_scales=row_scales,
                   grid=grid)


def emulate(x2: torch.Tensor, p: Packed) -> torch.Tensor:
    """What the kernel computes, replayed in float64 from the repacked tensors alone, register by register: each
    lane's A registers decoded as the kernel decodes them, placed where PTX's m16n8k16 fragment layout puts them
    (a_r: row g + 8 (r % 2), column 2t + 8 (r // 2) + half; b_j: column 2t + 8 j + half of token g), one product per
    mma step, zero point and scale per group.  Independent of ``_fragment_map``: it checks the repack against the
    hardware's fragment semantics.  [M, N] float64, no bias."""
    dev = p.w.device
    tiles, chunks = p.w.shape[:2]
    words = (p.w.to(torch.int64) & 0xFFFFFFFF).reshape(tiles, chunks, -1, 32, 4)  # [.., loads, lane, word]
    lane = torch.arange(32, device=dev)
    g, t = lane // 4, lane % 4
    a = torch.zeros(tiles, chunks, 4, 16, 16, dtype=torch.float64, device=dev)  # [.., step, row, kappa]
    fp4 = p.bits >= 40
    from humming_triton.formats.dtypes import parse_element_type
    e4m3 = parse_element_type("e4m3fn").decode(torch.arange(256, device=dev)).double()  # the value of each code
    if fp4:
        table = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64,
                             device=dev)
        sc = p.fp4_scales.to(torch.int64)  # [tiles, chunks, lane, (row g, row g + 8)]
        # the block scale folded with 2^(126 - j) of its row: e8m0 codes arrive as that bf16 exponent field (0: zero,
        # 255: inf), e4m3 codes times 2^110 (j = 16); then the decode's e2m1 value x 2^-126
        if p.bits == 40:
            sval = torch.where(sc == 0, 0.0, torch.exp2(sc.double() - 127))
            sval = torch.where(sc == 255, float("inf"), sval)
        else:
            sval = e4m3[sc] * 2.0 ** 110
        sval = sval * 2.0 ** -126
    for s in range(4):
        for r in range(4):
            for half in range(2):
                if p.code_bits == 4:  # register r: nibbles r (low half) and r + 4 (high half) of word s
                    field = (words[:, :, 0, :, s] >> (4 * (r + 4 * half))) & 0xF
                else:  # rows g / g + 8 in words 2 (s % 2) / + 1 of load s // 2; register r // 2 picks bytes 0-1 / 2-3
                    word = words[:, :, s // 2, :, 2 * (s % 2) + r % 2]
                    field = (word >> (8 * (2 * (r // 2) + half))) & 0xFF
                if fp4:
                    # the lane's folded block scale; the kernel's one bf16 multiply rounds (underflows) as bf16 does
                    val = (table[field] * sval[:, :, :, r % 2]).to(torch.bfloat16).double()
                else:
                    val = e4m3[field] if p.bits == E4M3 else field.double()
                a[:, :, s, g + 8 * (r % 2), 2 * t + 8 * (r // 2) + half] = val
    m = x2.shape[0]
    xk = torch.zeros(m, chunks * CHUNK, dtype=torch.float64, device=dev)
    xk[:, :p.k] = x2.double()
    kappa = torch.arange(16, device=dev)
    tq, j, half = (kappa % 8) // 2, kappa // 8, kappa % 2  # lane quad position, register b_j, half
    c = torch.arange(chunks, device=dev).view(-1, 1, 1)
    s = torch.arange(4, device=dev).view(1, -1, 1)
    b = xk[:, CHUNK * c + 16 * tq + 4 * s + 2 * j + half]  # [M, chunks, step, kappa]: what lane loads as b_j
    if fp4:  # the fp32 result times 2^j per row
        rows = p.scales[:, 0].permute(0, 2, 1).reshape(tiles * 16).double()
        y = torch.einsum("tcsrk,mcsk->tcrm", a, b).sum(1).reshape(tiles * 16, m) * rows[:, None]
        return y[:p.n].T * p.out_scale
    zero = p.zeros if p.zeros is not None else torch.full_like(p.scales, 0.0 if p.bits == E4M3 else
                                                                   float(1 << (p.code_bits - 1)))

    def per_row(v):  # [tiles, G, 8, 2] -> [tiles, G, 16]
        return v.permute(0, 1, 3, 2).reshape(tiles, v.shape[1], 16).double()

    gc = chunks if p.group_chunks == 0 else p.group_chunks
    grp = torch.arange(chunks, device=dev) // gc
    a = a - per_row(zero)[:, grp][:, :, None, :, None]  # (u - c): exact small integers, as in the kernel
    part = torch.einsum("tcsrk,mcsk->tcrm", a, b)  # one product per mma step, summed over the chunk's steps
    y = (part * per_row(p.scales)[:, grp][..., None]).sum(1)  # [tiles, 16, M]
    return y.reshape(tiles * 16, m)[:p.n].T
