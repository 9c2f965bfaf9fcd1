"""Test-side producers: pack random codes the way each checkpoint producer documents it (see
/work/shared/formats.md), written independently of humming_triton's own packing code, and the producers'
dequantization formulas computed in float64 then rounded once to float32."""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def to_i32(words64: torch.Tensor) -> torch.Tensor:
    return torch.where(words64 >= 2 ** 31, words64 - 2 ** 32, words64).to(torch.int32)


def pack_lsb_stream(vals: torch.Tensor, bits: int, axis: int) -> torch.Tensor:
    """Values along ``axis`` -> int32 words, value i at stream bit bits*i, crossing word boundaries."""
    v = vals.movedim(axis, 0).to(torch.int64)
    count = v.shape[0]
    nwords = (count * bits + 31) // 32
    words = torch.zeros((nwords, *v.shape[1:]), dtype=torch.int64)
    for i in range(count):
        pos = i * bits
        w, sh = pos // 32, pos % 32
        words[w] |= (v[i] << sh) & 0xFFFFFFFF
        if sh + bits > 32:
            words[w + 1] |= v[i] >> (32 - sh)
    return to_i32(words).movedim(0, axis).contiguous()


def pack_padded(vals: torch.Tensor, bits: int, axis: int) -> torch.Tensor:
    """Old compressed-tensors layout: 32 // bits values per word, LSB first, no crossing."""
    v = vals.movedim(axis, 0).to(torch.int64)
    per = 32 // bits
    nwords = -(-v.shape[0] // per)
    words = torch.zeros((nwords, *v.shape[1:]), dtype=torch.int64)
    for i in range(v.shape[0]):
        words[i // per] |= v[i] << (bits * (i % per))
    return to_i32(words).movedim(0, axis).contiguous()


def pack_awq(q: torch.Tensor) -> torch.Tensor:
    """[R, N] nibbles -> [R, N/8] int32; column c of each 8-group goes to slot [0,4,1,5,2,6,3,7][c]."""
    slot_of_col = [0, 4, 1, 5, 2, 6, 3, 7]
    r, n = q.shape
    words = torch.zeros(r, n // 8, dtype=torch.int64)
    for c in range(n):
        words[:, c // 8] |= q[:, c].to(torch.int64) << (4 * slot_of_col[c % 8])
    return to_i32(words)


def pack_nibbles_low_first(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] 4-bit codes -> [..., K/2] uint8, even element in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def fp4_value(codes: torch.Tensor) -> torch.Tensor:
    mag = torch.tensor(FP4, dtype=torch.float64)[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def random_e4m3(rng, shape, positive=False, lo=0, hi=0x7E) -> torch.Tensor:
    """Random float8_e4m3fn values (never NaN)."""
    b = torch.randint(lo, hi + 1, shape, generator=rng, dtype=torch.int32)
    if not positive:
        b = b | (torch.randint(0, 2, shape, generator=rng, dtype=torch.int32) << 7)
    return b.to(torch.uint8).view(torch.float8_e4m3fn)


def random_scales(rng, shape, dtype=torch.float16) -> torch.Tensor:
    return (torch.rand(shape, generator=rng, dtype=torch.float64) * 0.02 + 0.001).to(dtype)


def write_checkpoint(path, tensors: dict, qcfg: dict | None, extra_config: dict | None = None) -> str:
    os.makedirs(path, exist_ok=True)
    cfg = dict(extra_config or {})
    if qcfg is not None:
        cfg["quantization_config"] = qcfg
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(path, "model.safetensors"))
    return str(path)


# --- producers: (tensors, expected float32 weight [N, K]) ---------------------------------------------------
def gptq_layer(rng, n, k, bits, group, sym, v2, act_order):
    g = k if group == -1 else group
    ng = k // g
    q = torch.randint(0, 2 ** bits, (k, n), generator=rng)
    if sym:
        z = torch.full((ng, n), 2 ** (bits - 1))
    else:
        z = torch.randint(0 if v2 else 1, 2 ** bits, (ng, n), generator=rng)
    s = random_scales(rng, (ng, n))
    if act_order:
        perm = torch.randperm(k, generator=rng)
        g_idx = torch.empty(k, dtype=torch.int64)
        g_idx[perm] = torch.arange(k) // g
    else:
        g_idx = torch.arange(k) // g
    stored_z = z if v2 else (z - 1) & (2 ** bits - 1)
    t = {"qweight": pack_lsb_stream(q, bits, 0), "qzeros": pack_lsb_stream(stored_z, bits, 1), "scales": s,
         "g_idx": g_idx.to(torch.int32)}
    w = s.double()[g_idx] * (q.double() - z.double()[g_idx])  # [K, N]
    return t, w.t().float()


def awq_layer(rng, n, k, group):
    q = torch.randint(0, 16, (k, n), generator=rng)
    z = torch.randint(0, 16, (k // group, n), generator=rng)
    s = random_scales(rng, (k // group, n))
    gi = torch.arange(k) // group
    t = {"qweight": pack_awq(q), "qzeros": pack_awq(z), "scales": s}
    return t, ((q.double() - z.double()[gi]) * s.double()[gi]).t().float()
