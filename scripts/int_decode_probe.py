"""A/B of the quantized-activation tile loop's weight decode (``dense.INT_DECODE_ACT``, ``PACKED_E4M3_ACT``): the integer / packed
decode kinds (7, 8, 9) against the fp32 round trip (2, 5), the same configs in the same run, with the table's
current pick (``auto``) beside them.  Each new output is checked against the old one of the same config (both are
fp32 sums of the same exact products).  GPU only.

``python3 scripts/int_decode_probe.py [--schemes w4a8-int8,...] [--m 64,256,...] [--out probe.json]``"""
import argparse
import json
import sys

import torch

import humming_triton as ht
from humming_triton.calls import Call, KernelConfig
from humming_triton.kernels import dense, families

# beyond the family's own candidates: the large K-tile shapes the int32-accumulating kind 9 can afford
EXTRA = [KernelConfig("act_tiled", 128, 128, 128, 1, 8, 8, 3), KernelConfig("act_tiled", 128, 256, 128, 1, 8, 8, 3),
         KernelConfig("act_tiled", 64, 128, 128, 1, 8, 4, 3), KernelConfig("act_tiled", 128, 128, 64, 1, 8, 4, 4),
         KernelConfig("act_tiled", 64, 256, 128, 1, 8, 8, 3)]


def main(argv=None) -> int:
    from benchmarks.timing import time_gpu
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", default="w4a8-int8,w8a8-int8,w4a8-fp8")
    ap.add_argument("--m", default="64,256,1024,4096")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    defaults = dense.INT_DECODE_ACT, dense.PACKED_E4M3_ACT  # "auto" runs the library's defaults
    rows = []
    for scheme in args.schemes.split(","):
        qw = ht.quantize_weight(torch.randn(args.n, args.k), scheme).to("cuda")
        for m in map(int, args.m.split(",")):
            x = torch.randn(m, args.k, device="cuda", dtype=torch.bfloat16)
            call = Call("quant_linear", qw.scheme, x.dtype, m, args.n, args.k)
            cfgs = list(dict.fromkeys(families.get("act_tiled").candidates(call) + EXTRA))
            ht.quant_linear(x, qw)
            auto = time_gpu(lambda: ht.quant_linear(x, qw), budget_s=0.1)["us"]
            plan = ht.dispatch.last_plan()
            print(f"{scheme} M={m}: auto {auto:.1f} us ({plan})", flush=True)
            for cfg in cfgs:
                row = dict(scheme=scheme, m=m, config=cfg.to_json(), auto_us=auto, auto_plan=str(plan))
                outs = {}
                for flag in (False, True):
                    dense.INT_DECODE_ACT = dense.PACKED_E4M3_ACT = flag
                    out = torch.empty(m, args.n, device="cuda", dtype=torch.bfloat16)
                    try:
                        dense.triton_linear(x, qw, config=cfg, out=out)
                        torch.cuda.synchronize()
                        outs[flag] = out.float()
                        row["new_us" if flag else "old_us"] = time_gpu(
                            lambda: dense.triton_linear(x, qw, config=cfg, out=out), budget_s=0.1)["us"]
                    except Exception as e:  # noqa: BLE001 -- a config the kernel cannot take: record why
                        row["new_err" if flag else "old_err"] = f"{type(e).__name__}: {str(e)[:200]}"
                dense.INT_DECODE_ACT, dense.PACKED_E4M3_ACT = defaults
                if len(outs) == 2:
                    a, b = outs[False], outs[True]
                    row["rel_diff"] = ((a - b).norm() / a.norm().clamp_min(1e-30)).item()
                rows.append(row)
                c = cfg
                print(f"  {c.block_m}x{c.block_n}x{c.block_k} w={c.num_warps} st={c.num_stages}: old "
                      f"{row.get('old_us', float('nan')):.1f} new {row.get('new_us', float('nan')):.1f} us "
                      f"rel_diff {row.get('rel_diff', float('nan')):.2e} {row.get('new_err', '')}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
