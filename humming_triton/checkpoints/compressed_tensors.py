"""compressed-tensors (``quant_method: "compressed-tensors"``, llm-compressor's output).

Config: ``config_groups.<g>.{targets, weights, input_activations, format?}``, a global ``format``, ``ignore``,
``version``.  ``weights`` = ``{num_bits, type: int|float, symmetric, strategy: tensor|channel|group|block|
tensor_group, group_size, block_structure, actorder}``.  Per layer ``<prefix>``:

* ``pack-quantized`` -- ``weight_packed`` int32 ``[N, words]`` packed along K LSB first; the signed value ``q``
  is stored as ``q + 2**(bits-1)``; ``weight_scale [N, K/G]`` / ``[N, 1]`` / ``[1]``; ``weight_zero_point``
  (asym) packed along N with the same offset; ``weight_shape [2]``; ``weight_g_idx`` with act-order.  For
  3/5/6/7 bits newer releases pack densely across words (= our layout, imported without unpacking), older
  ones put ``32 // bits`` values in each word and pad.  The word count tells them apart whenever it differs;
  when it does not (tiny K) the ``version`` decides (dense from ``DENSE_SINCE``, an assumption: the exact
  release is not pinned down here).  Symmetric: ``w = q * s`` -> signed codes (``stored ^ 2**(bits-1)``,
  exact); asymmetric: ``w = (q - z) * s = (stored - stored_z) * s`` -> unsigned codes + uint8 zero.
* ``float-quantized`` (FP8) -- ``weight`` e4m3fn ``[N, K]``, ``weight_scale`` ``[1]`` / ``[N, 1]`` /
  ``[ceil(N/bn), ceil(K/bk)]``; ``int-quantized`` -- ``weight`` int8 ``[N, K]``, same scales.
* ``nvfp4-pack-quantized`` -- ``weight_packed`` uint8 ``[N, K/2]`` (low nibble = even k), ``weight_scale``
  e4m3fn ``[N, K/16]``, ``weight_global_scale`` fp32 ``[1]``; ``w = fp4 * s / global`` (the *reciprocal* of
  ModelOpt's convention).  Our global scale multiplies, so it stores ``1/global`` rounded to fp32: bit-exact
  when ``global`` is a power of two, else within 1 ulp of the producer's division (the e2m1 x e4m3 product is
  exact, only the final rounding can differ).
* ``mxfp4-pack-quantized`` -- ``weight_packed`` uint8 ``[N, K/2]``, ``weight_scale`` uint8 e8m0 ``[N, K/32]``.

Activation settings map onto ``QuantScheme.act`` where ours can express them (token / tensor / group, dynamic
or static ``input_scale``; NVFP4 activations with the static ``input_global_scale``, inverted likewise).

Rank windows (``ShardSpec``): every layout here stores rows of N, so an N window reads rows ``[a, b)`` of the
codes; a K window reads columns (words / bytes: split points sit on word boundaries) -- except the old padded
3/5/6/7-bit packing, whose words do not start at split points: there a K window reads whole rows and drops the
other columns after unpacking.  Scales, zero points and ``weight_g_idx`` are read whole.
"""
from __future__ import annotations

import re

import torch

from ..formats.dtypes import WideFloat, parse_element_type
from ..formats.packing import pack_codes, packed_words
from ..formats.scheme import ActQuant
from ..formats.weight import QuantWeight
from ._common import (ROWS, CheckpointFormatError, Tensors, byte_words, ceil_div, check_shape, e8m0_codes, finish,
                      float_weight, fp4_words, int_weight, packed_fp4, regroup_by_g_idx, unpack_along, window_slices)

FMT = "compressed-tensors"
DENSE_SINCE = (0, 10, 0)  # assumed first release packing 3/5/6/7-bit values densely (see module doc)
FORMATS = ("pack-quantized", "float-quantized", "naive-quantized", "int-quantized", "nvfp4-pack-quantized",
           "mxfp4-pack-quantized")


def _version(v) -> tuple[int, ...]:
    nums = re.findall(r"\d+", str(v or "0"))[:3]
    return tuple(int(x) for x in nums) + (0,) * (3 - len(nums))


def group_for(qcfg: dict, name: str) -> dict:
    """The config group whose targets match module ``name`` (regex/name targets beat class-name targets)."""
    groups = qcfg.get("config_groups") or {}
    if not groups:
        raise CheckpointFormatError(f"{FMT}: quantization_config has no config_groups")
    by_class = None
    for g in groups.values():
        for tgt in g.get("targets", []):
            if tgt.startswith("re:") and re.match(tgt[3:], name):
                return g
            if name == tgt or name.endswith("." + tgt):
                return g
            if tgt[:1].isupper():  # a module class such as "Linear": every quantized layer here is one
                by_class = by_class or g
    if by_class is None and len(groups) == 1:
        by_class = next(iter(groups.values()))
    if by_class is None:
        raise CheckpointFormatError(f"{FMT}: no config group targets layer {name!r}")
    return by_class


def _block(w: dict, n: int, k: int) -> tuple[int, int]:
    strategy = w.get("strategy", "tensor")
    if strategy == "tensor":
        return 0, 0
    if strategy == "channel":
        return 1, 0
    if strategy in ("group", "tensor_group"):
        return 1, int(w["group_size"])
    if strategy == "block":
        bn, bk = w["block_structure"]
        return int(bn), int(bk)
    raise CheckpointFormatError(f"{FMT}: unknown weight strategy {strategy!r}")


def _scales_2d(s: torch.Tensor, block, n: int, k: int, what: str) -> torch.Tensor:
    bn, bk = block
    want = (1, 1) if block == (0, 0) else (ceil_div(n, bn), 1 if bk == 0 else ceil_div(k, bk))
    if s.numel() == want[0] * want[1] and s.dim() <= 2 and (s.dim() < 2 or tuple(s.shape) == want or want == (1, 1)):
        return s.reshape(want)
    raise CheckpointFormatError(f"{FMT}: {what} must have shape {list(want)}, got {list(s.shape)}")


def _act(g: dict, t: Tensors, prefix: str) -> tuple[ActQuant | None, torch.Tensor | None]:
    a = g.get("input_activations")
    if not a:
        return None, None
    elem = "e4m3fn" if a.get("type") == "float" and a.get("num_bits") == 8 else \
        "e2m1" if a.get("type") == "float" and a.get("num_bits") == 4 else f"int{a.get('num_bits')}"
    strategy, dynamic = a.get("strategy", "tensor"), a.get("dynamic", True)
    if strategy == "tensor_group":  # NVFP4 activations: dynamic e4m3 group scales under a calibrated global
        gsc = t.get(f"{prefix}.input_global_scale", FMT)
        return ActQuant(parse_element_type("e2m1"), parse_element_type("e4m3fn"), True, int(a.get("group_size", 16)),
                        global_scale=True, static=True), 1.0 / gsc.float()
    sd = parse_element_type("e8m0") if elem == "e2m1" else WideFloat("fp32")
    if dynamic is False or dynamic == "false":
        if strategy != "tensor":
            raise CheckpointFormatError(f"{FMT}: static {strategy} activation scales are not supported")
        return ActQuant(parse_element_type(elem), sd, per_token=False, static=True), \
            t.get(f"{prefix}.input_scale", FMT)
    if strategy == "group":
        return ActQuant(parse_element_type(elem), sd, True, int(a["group_size"])), None
    return ActQuant(parse_element_type(elem), sd, per_token=strategy == "token"), None


def _unpack_padded(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Older layout: ``32 // bits`` values per int32 word, LSB first, high bits unused."""
    per = 32 // bits
    w = words.to(torch.int64) & 0xFFFFFFFF
    vals = torch.stack([(w >> (bits * i)) & ((1 << bits) - 1) for i in range(per)], dim=-1)
    return vals.reshape(*words.shape[:-1], -1)[..., :count].to(torch.int32)


def _is_dense(have: int, bits: int, count: int, version, what: str) -> bool:
    """Dense or padded stream (module doc): the word count decides when it can, else the version."""
    dense, padded = packed_words(count, bits), ceil_div(count, 32 // bits)
    if have not in (dense, padded):
        raise CheckpointFormatError(f"{FMT}: {what} has {have} words for {count} {bits}-bit values; expected "
                                    f"{dense} (dense) or {padded} (padded)")
    if bits in (1, 2, 4, 8) or dense != padded:
        return have == dense
    return _version(version) >= DENSE_SINCE


def _stream(words: torch.Tensor, bits: int, count: int, version, dim: int, what: str) -> torch.Tensor:
    """Codes along ``dim`` from a dense or padded int32 stream."""
    w = words.to(torch.int32).movedim(dim, -1)
    dense = _is_dense(w.shape[-1], bits, count, version, what)
    codes = unpack_along(w, bits, count, -1) if dense else _unpack_padded(w, bits, count)
    return codes.movedim(-1, dim)


def import_pack_quantized(t: Tensors, prefix: str, w: dict, version, act, input_scale) -> QuantWeight:
    name = f"{prefix}.weight_packed"
    packed = t.meta(name, FMT)
    n, k = (int(v) for v in t.get(f"{prefix}.weight_shape", FMT).reshape(-1).tolist())
    bits = int(w["num_bits"])
    if packed.dtype != torch.int32 or packed.dim() != 2 or packed.shape[0] != n:
        raise CheckpointFormatError(f"{FMT}: {name} must be int32 [{n}, words], got {packed.dtype} "
                                    f"{list(packed.shape)}")
    block = _block(w, n, k)
    scales = _scales_2d(t.get(f"{prefix}.weight_scale", FMT), block, n, k, f"{prefix}.weight_scale")
    g_idx = t.opt(f"{prefix}.weight_g_idx")
    k_perm = None
    dense = _is_dense(packed.shape[1], bits, k, version, name)
    repack = not dense  # dense: already our canonical stream (of offset codes), no unpacking
    if w.get("symmetric", True):
        zeros = torch.full(scales.shape, 1 << (bits - 1), dtype=torch.int64)
    else:
        zp = t.get(f"{prefix}.weight_zero_point", FMT)
        if tuple(zp.shape) == tuple(scales.shape) or zp.numel() == scales.numel() == 1:
            zeros = zp.reshape(scales.shape).to(torch.int64) + (1 << (bits - 1))  # stored unpacked: signed values
        else:
            zeros = _stream(zp, bits, scales.shape[0], version, 0, f"{prefix}.weight_zero_point")
    if g_idx is not None:
        k_perm, size, gs = regroup_by_g_idx(g_idx, k, FMT)
        if k_perm is not None or size != block[1]:
            repack = True
            if size is None:
                block, scales, zeros = (1, 1), scales[:, gs], zeros[:, gs]
            else:
                block = (1, size)
    layer = int_weight(bits=bits, n=n, k=k, scales=scales, zeros=zeros, block=block, k_perm=k_perm, act=act,
                       input_scale=input_scale, bias=t.opt(f"{prefix}.bias"), fmt=f"{FMT} {prefix}")

    def read_words(win):
        kwin = win if win is not None and win[0] == "k" else None
        if dense:
            q = t.read(name, FMT, window_slices(win, 2, ROWS, {"k": (bits, 32)}))
            if not repack:
                return q
            codes = unpack_along(q, bits, k if kwin is None else kwin[2] - kwin[1], -1)
        else:  # padded words: a K window reads whole rows (module doc)
            codes = _unpack_padded(t.read(name, FMT, window_slices(None if kwin else win, 2, ROWS)), bits, k)
            codes = codes if kwin is None else codes[:, kwin[1]:kwin[2]]
        return pack_codes(codes if k_perm is None else codes[:, k_perm], bits)

    return finish(t, prefix, layer, read_words, f"{FMT} {prefix}", unsigned=True)


def import_unpacked(t: Tensors, prefix: str, w: dict, act, input_scale) -> QuantWeight:
    """float-quantized (e4m3fn / e5m2 bytes) and int-quantized (int8) weights stored one value per byte."""
    name = f"{prefix}.weight"
    weight = t.meta(name, FMT)
    n, k = weight.shape
    block = _block(w, n, k)
    scales = _scales_2d(t.get(f"{prefix}.weight_scale", FMT), block, n, k, f"{prefix}.weight_scale")
    bias = t.opt(f"{prefix}.bias")
    read_words = byte_words(t, name, FMT)
    if w.get("type") == "int":
        if weight.dtype != torch.int8 or not w.get("symmetric", True):
            raise CheckpointFormatError(f"{FMT}: int-quantized {name} must be symmetric int8, got "
                                        f"{weight.dtype} symmetric={w.get('symmetric')}")
        layer = int_weight(bits=8, n=n, k=k, scales=scales, zeros=None, signed=True, block=block, act=act,
                           input_scale=input_scale, bias=bias, fmt=f"{FMT} {prefix}")
        return finish(t, prefix, layer, read_words, f"{FMT} {prefix}")
    names = {torch.float8_e4m3fn: "e4m3fn", torch.float8_e5m2: "e5m2"}
    if weight.dtype not in names:
        raise CheckpointFormatError(f"{FMT}: float-quantized {name} must be float8_e4m3fn or float8_e5m2, "
                                    f"got {weight.dtype}")
    layer = float_weight(elem=names[weight.dtype], scales=scales, n=n, k=k, block=block, act=act,
                         input_scale=input_scale, bias=bias, fmt=f"{FMT} {prefix}")
    return finish(t, prefix, layer, read_words, f"{FMT} {prefix}")


def import_fp4(t: Tensors, prefix: str, kind: str, act, input_scale) -> QuantWeight:
    """nvfp4 / mxfp4 pack-quantized: bytes of two e2m1 codes (low nibble = even k) = our 4-bit stream."""
    _, n, k = packed_fp4(t, f"{prefix}.weight_packed", FMT)
    s = t.get(f"{prefix}.weight_scale", FMT)
    gscale = None
    if kind == "nvfp4":
        check_shape(s, (n, ceil_div(k, 16)), f"{prefix}.weight_scale", FMT, (torch.float8_e4m3fn,))
        scales, sdt, g = s.view(torch.uint8), "e4m3fn", 16
        glob = t.get(f"{prefix}.weight_global_scale", FMT).float()
        if glob.numel() != 1:
            raise CheckpointFormatError(f"{FMT}: {prefix}.weight_global_scale must hold one value")
        gscale = (1.0 / glob.reshape(())).float()  # producer divides, we multiply (module doc)
    else:
        check_shape(s, (n, ceil_div(k, 32)), f"{prefix}.weight_scale", FMT)
        scales, sdt, g = e8m0_codes(s, f"{prefix}.weight_scale", FMT), "e8m0", 32
    layer = float_weight(elem="e2m1", scales=scales, scale_dtype=sdt, n=n, k=k, block=(1, g), global_scale=gscale,
                         act=act, input_scale=input_scale, bias=t.opt(f"{prefix}.bias"), fmt=f"{FMT} {prefix}")
    return finish(t, prefix, layer, fp4_words(t, f"{prefix}.weight_packed", FMT), f"{FMT} {prefix}")


def read(t: Tensors, qcfg: dict, hints: dict) -> dict[str, QuantWeight]:
    version, default_fmt = qcfg.get("version"), qcfg.get("format", "pack-quantized")
    out = {}
    for key in sorted(t.keys):
        if key.endswith(".weight_packed"):
            prefix = key[: -len(".weight_packed")]
        elif key.endswith(".weight_scale") and key[:-13] + ".weight" in t and key[:-13] + ".weight_packed" not in t:
            prefix = key[: -len(".weight_scale")]  # float-/int-quantized: one value per byte in .weight
        else:
            continue
        g = group_for(qcfg, prefix)
        fmt = g.get("format") or default_fmt
        if fmt not in FORMATS:
            raise CheckpointFormatError(f"{FMT}: format {fmt!r} of layer {prefix!r} is not supported; "
                                        f"supported: {', '.join(FORMATS)}")
        act, input_scale = _act(g, t, prefix)
        w = g.get("weights") or {}
        if fmt.startswith("nvfp4") or fmt.startswith("mxfp4"):
            out[prefix] = import_fp4(t, prefix, fmt[:5], act, input_scale)
        elif fmt == "pack-quantized":
            if w.get("type", "int") != "int":
                raise CheckpointFormatError(f"{FMT}: pack-quantized layer {prefix!r} must have int weights")
            out[prefix] = import_pack_quantized(t, prefix, w, version, act, input_scale)
        else:
            out[prefix] = import_unpacked(t, prefix, w, act, input_scale)
    return out
