"""Compile a dense kernel for a GPU target without a GPU and report what the compiler made of it.

``python -m humming_triton.kernels.inspect w4a16 --m 1,16,256`` prints, per config: registers, stack bytes
(spills), shared memory, and SASS counts (16-byte loads, local-memory loads, wgmma/mma instructions).  This is
how a config or a kernel change is vetted between GPU sessions; must run with TRITON_INTERPRET unset.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import torch

from ..calls import Call, KernelConfig
from ..formats.scheme import QuantScheme
from . import configs, families
from .families import packed_int4
from .format_args import format_constexprs
from .launch import launch_format

_SASS_COUNTS = {"ldg128": "LDG.E.128", "ldg_u16": "LDG.E.U16", "ldl": "LDL", "hgmma": "HGMMA", "hmma": "HMMA",
                "qgmma": "QGMMA", "igmma": "IGMMA", "imma": "IMMA",
                "shfl": "SHFL", "bar": "BAR"}


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_report(scheme: str, m: int, n: int, k: int, cfg: KernelConfig | None = None,
                   act: str = "bf16", arch: int = 90) -> dict:
    """Compile the kernel ``triton_linear`` would launch for this config (default: the built-in heuristic's)
    with the runtime's divisibility specialisation, and report resources and SASS instruction counts."""
    from .dense import act_constexprs, default_config, fitted
    s = QuantScheme.parse(scheme)
    call = Call("quant_linear", s, getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}.get(act, act)), m, n, k)
    cfg = fitted(cfg or default_config(call), call)
    fam = families.get(cfg.family)
    fmt = format_constexprs(s, n, k)
    ptrs = _pointer_types(s, act, cfg.split_k)
    ints = dict(M=m, N=n, K=k, stride_xm=k, stride_wn=(k * s.bits + 31) // 32, stride_ym=n)
    if fam.name == "act_tiled":
        from ._dense_tiled import dense_tiled_kernel
        consts = act_constexprs(fmt, call, cfg, False)
        ptrs.update(x_ptr="*u8", xs_ptr="*u8" if consts["ACT_KIND"] in (3, 4) else "*fp32")
        out = _compile(dense_tiled_kernel, consts, ptrs, ints, cfg.num_warps, cfg.num_stages, arch)
    else:
        spec = fam.spec(launch_format(fmt, k, cfg.block_k), call, cfg, False)
        if spec is None:
            raise ValueError(f"{fam.name} is not one Triton launch (it composes torch ops); inspect a kernel family")
        ptrs["xs_ptr"] = "*fp32"
        out = _compile(spec.kernel, spec.constexprs, ptrs, ints, spec.num_warps, spec.num_stages, arch)
    return {"scheme": s.name, "M": m, "N": n, "K": k, **cfg.to_json(), **out}


def grouped_report(scheme: str, n: int, k: int, experts: int, rows: int, act: str = "bf16", arch: int = 90,
                   act_order: bool = False, swap: bool = False) -> dict:
    """The same report for the grouped (MoE) kernel with the tiles its launcher picks for ``rows`` routed rows
    (``act_order``: experts with a K permutation, gathered in the kernel; ``swap``: the ``grouped_swapab``
    family's first candidate, 16-bit activations)."""
    from ._grouped_tiled import grouped_tiled_kernel
    from .dense import act_block_k, act_kind, int_decode_kind
    from .launch import post_scale
    s = QuantScheme.parse(scheme)
    block_m, block_n, block_k = configs.grouped_tiles(rows, experts, s.bits, s.zero != "none")
    warps, stages = 4, 3
    if swap:
        dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}.get(act, act))
        cfg = families.get("grouped_swapab").candidates(Call("grouped_linear", s, dtype, rows, n, k, experts))[0]
        block_m, block_n, block_k, warps, stages = cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, \
            cfg.num_stages
    kind = act_kind(s.act, block_m)
    fmt = format_constexprs(s, n, k)
    block_k = configs.fit_block_k(block_k, fmt["GROUP_K"], k, s.bits)
    if s.act is not None:
        block_k = act_block_k(block_k, s, k)
    if fmt["GROUP_K"] >= k:
        fmt["GROUP_K"] = max(k, block_k)
    post = post_scale(fmt, block_k) and not (swap and block_m > 16)
    kind = int_decode_kind(kind, fmt, post, k, s.act, grouped=True) if s.act is not None else kind
    if swap and kind == 0 and packed_int4(fmt, post, torch.bfloat16 if act == "bf16" else torch.float16):
        kind = 6
    consts = dict(E_POW2=triton.next_power_of_2(experts), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=1,
                  POST_SCALE=post, DOT_F32=False, EVEN_K=k % block_k == 0, HAS_BIAS=False, HAS_PERM=act_order,
                  ACT_KIND=kind, SWAP_AB=swap,
                  ACT_GROUP_K=(s.act.group_k or 1 << 30) if s.act is not None else 1,
                  **{**fmt, "HAS_GLOBAL": fmt["HAS_GLOBAL"] or (s.act is not None and s.act.global_scale)})
    ptrs = {**_pointer_types(s, act, 1), "offsets_ptr": "*i64", "tile_cum_ptr": "*i32", "cnt_ptr": "*i32",
            "xs_ptr": "*u8" if kind in (3, 4) else "*fp32", "perm_ptr": "*i64"}
    if s.act is not None:
        ptrs["x_ptr"] = "*u8"
    out = _compile(grouped_tiled_kernel, consts, ptrs, dict(N=n, K=k, stride_xm=k), warps, stages, arch)
    return {"scheme": s.name, "N": n, "K": k, "E": experts, "block_m": block_m, "block_n": block_n,
            "block_k": block_k, **out}


def _pointer_types(s: QuantScheme, act: str, split_k: int) -> dict:
    sdt = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}.get(str(s.scale.dtype), "*u8")
    return {"x_ptr": f"*{act}", "w_ptr": "*i32", "s_ptr": sdt, "z_ptr": sdt, "g_ptr": "*fp32", "b_ptr": f"*{act}",
            "y_ptr": f"*{act}", "ws_ptr": "*fp32", "cnt_ptr": "*i32"}


def _compile(kern, consts: dict, ptrs: dict, ints: dict, num_warps: int, num_stages: int, arch: int) -> dict:
    names = kern.arg_names
    signature = {a: ("constexpr" if a in consts else ptrs.get(a, "i32")) for a in names}
    # what the launcher sees at run time: 16-byte aligned pointers, integers divisible by 16 where they are
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names)
             if a in ptrs or (a in ints and ints[a] % 16 == 0)}
    src = ASTSource(fn=kern, signature=signature, constexprs={(names.index(a),): v for a, v in consts.items()},
                    attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                        options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(ck.asm["cubin"])
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", path], capture_output=True, text=True).stdout
        sass = subprocess.run([_tool("cuobjdump"), "-sass", path], capture_output=True, text=True).stdout
    out = {"registers": int(re.search(r"REG:(\d+)", res).group(1)),
           "stack_bytes": int(re.search(r"STACK:(\d+)", res).group(1)), "shared_bytes": ck.metadata.shared}
    out.update({name: sass.count(op) for name, op in _SASS_COUNTS.items()})
    out["loop_sass"] = _main_loop_size(sass)
    return out


def _main_loop_size(sass: str) -> int:
    """Instructions in the largest loop (a branch back to a lower address): the steady-state cost of one K
    tile, the number to divide by a tile's elements per thread."""
    best = 0
    for at, target in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\d\s+)?BRA\s+0x([0-9a-f]+)", sass):
        at, target = int(at, 16), int(target, 16)
        if target < at:
            best = max(best, (at - target) // 16 + 1)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m humming_triton.kernels.inspect",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("scheme")
    ap.add_argument("--shape", default="8192x8192", help="NxK")
    ap.add_argument("--m", default="1,16,64,256")
    args = ap.parse_args(argv)
    # the scheme is checked once, up front: a typo is one line and a non-zero exit, not one line per M
    try:
        QuantScheme.parse(args.scheme)
    except ValueError as e:
        print(f"{ap.prog}: {e}", file=sys.stderr)
        return 2
    n, k = map(int, args.shape.split("x"))
    for m in map(int, args.m.split(",")):
        try:
            print(compile_report(args.scheme, m, n, k))
        except ValueError as e:
            print(f"M={m}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
