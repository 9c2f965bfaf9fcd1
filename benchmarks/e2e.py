"""End-to-end decode speed of a quantized HF model vs bf16: ``python3 -m benchmarks.e2e``.

A random Llama-shaped model (built from config, no hub) is run one token at a time -- a decode step without a
KV cache, so the time is the weight-streaming GEMMs a real decode step is made of, plus norms and activations.
Each scheme is applied with ``ht.replace_linear``; every variant is timed eagerly and as a replayed CUDA graph
(what serving engines do), optionally under ``torch.compile(fullgraph=True)`` too; the output is checked
against the dequantized-weight model before timing.  Prints tokens/s and the ratio to bf16, writes JSON.

``--cpu``: a tiny model on the CPU (reference backend) -- the smoke mode CI runs; its times mean nothing.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch

import humming_triton as ht


def build(kind: str, hidden: int, layers: int, vocab: int, device, dtype):
    """A random Llama (dense) or Qwen3-MoE (64 experts, top-8, like Qwen3-30B-A3B's blocks) from config."""
    import transformers
    common = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 128),
                  num_key_value_heads=max(1, hidden // 512), head_dim=128, vocab_size=vocab,
                  max_position_embeddings=256, tie_word_embeddings=False)
    if kind == "llama":
        cfg = transformers.LlamaConfig(intermediate_size=int(hidden * 2.75) // 128 * 128, **common)
    elif kind == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(intermediate_size=hidden * 3, moe_intermediate_size=max(128, hidden * 3 // 8),
                                          num_experts=64, num_experts_per_tok=8, **common)
    else:
        raise ValueError(f"unknown model {kind!r}; expected llama or qwen3_moe")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(device=device, dtype=dtype).eval()
    if kind == "qwen3_moe" and device.type == "cuda":
        # the bf16 baseline on torch._grouped_mm: HF's eager experts loop syncs with the host (no CUDA graph)
        model.set_experts_implementation("grouped_mm")
    return model


def _time(fn, device, reps: int) -> float:
    """Median seconds of ``fn()``."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _graphed(model, ids):
    """Capture one forward in a CUDA graph; replaying it re-runs every kernel with no Python in between."""
    static_ids = ids.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(2):
            model(static_ids, use_cache=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = model(static_ids, use_cache=False).logits
    return graph.replay, out


def run(args) -> dict:
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    base = build(args.model, args.hidden, args.layers, args.vocab, device, dtype)
    ids = torch.randint(0, args.vocab, (args.batch, 1), device=device)
    records = []
    variants = [("bf16", None)] + [(s, s) for s in args.schemes]
    for name, scheme in variants:
        model = copy.deepcopy(base) if scheme else base
        rec = {"model": args.model, "scheme": name, "hidden": args.hidden, "layers": args.layers,
               "batch": args.batch}
        try:
            if scheme:
                ht.replace_linear(model, scheme, skip=("lm_head",), backend=args.backend)
            with torch.no_grad():
                logits = model(ids, use_cache=False).logits.float()
                if scheme:
                    ref = _dequantized_twin(model, base)(ids, use_cache=False).logits.float()
                    rec["rel_err_vs_dequantized"] = float((logits - ref).norm() / ref.norm())
                    rec["backend"] = ht.last_backend()
                    if args.model == "qwen3_moe":
                        rec["moe_backend"] = ht.last_backend("fused_moe")
                rec["eager_s"] = _time(lambda: model(ids, use_cache=False), device, args.reps)
        except Exception as e:  # noqa: BLE001 -- a failing variant is a row, not a crash
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        # each faster mode on its own: one failing (e.g. a host sync under capture) must not hide the others
        if "error" not in rec and device.type == "cuda":
            try:
                replay, out = _graphed(model, ids)
                rec["graph_s"] = _time(replay, device, args.reps)
                rec["graph_rel_diff_vs_eager"] = float((out.float() - logits).norm() / logits.norm())
            except Exception as e:  # noqa: BLE001
                rec["graph_error"] = f"{type(e).__name__}: {e}"[:300]
        if "error" not in rec and args.compile:
            try:
                compiled = torch.compile(model, fullgraph=True)
                with torch.no_grad():
                    rec["compile_s"] = _time(lambda: compiled(ids, use_cache=False), device, args.reps)
                    out = compiled(ids, use_cache=False).logits.float()
                # inductor fuses the bf16 norms / activations differently from eager: report the size of it
                rec["compile_rel_diff_vs_eager"] = float((out - logits).norm() / logits.norm())
            except Exception as e:  # noqa: BLE001
                rec["compile_error"] = f"{type(e).__name__}: {e}"[:300]
        records.append(rec)
        print(_row(rec, records[0]), flush=True)
    return {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
            "records": records, "note": "decode step without KV cache: tokens/s = batch / step time"}


def _dequantized_twin(qmodel, base):
    """The same network with every QuantLinear / QuantMoE holding its dequantized weights in plain bf16."""
    twin = copy.deepcopy(base)
    for name, mod in qmodel.named_modules():
        if isinstance(mod, ht.QuantLinear):
            lin = twin.get_submodule(name)
            lin.weight.data.copy_(ht.dequantize_weight(mod.quant_weight).to(lin.weight.dtype))
        elif isinstance(mod, ht.QuantMoE):  # Qwen3-MoE experts are already in our [E, N, K] layout
            experts = twin.get_submodule(name)
            experts.gate_up_proj.data.copy_(ht.dequantize_weight(mod.gate_up_weight).to(experts.gate_up_proj.dtype))
            experts.down_proj.data.copy_(ht.dequantize_weight(mod.down_weight).to(experts.down_proj.dtype))
    return twin


def _row(rec: dict, bf16: dict) -> str:
    if "error" in rec:
        return f"{rec['scheme']:>10}: failed: {rec['error']}"
    fails = "".join(f"  [{k}: {rec[k]}]" for k in ("graph_error", "compile_error") if k in rec)
    parts = [f"{rec['scheme']:>10}:"]
    for key in ("eager_s", "graph_s", "compile_s"):
        if key in rec:
            tps = rec["batch"] / rec[key]
            ratio = bf16.get(key, rec[key]) / rec[key]
            parts.append(f"{key[:-2]} {tps:8.1f} tok/s ({ratio:.2f}x bf16)")
    if "rel_err_vs_dequantized" in rec:
        parts.append(f"err {rec['rel_err_vs_dequantized']:.1e} [{rec.get('backend')}"
                     f"{' moe=' + rec['moe_backend'] if 'moe_backend' in rec else ''}]")
    diffs = [f"{k.split('_')[0]} {rec[k]:.0e}" for k in ("graph_rel_diff_vs_eager", "compile_rel_diff_vs_eager")
             if k in rec]
    if diffs:
        parts.append("vs eager: " + ", ".join(diffs))
    return "  ".join(parts) + fails


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama", help="llama (dense) | qwen3_moe (64 experts, top-8)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--schemes", default="w4a16,w8a16,mxfp4,nvfp4")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(fullgraph=True)")
    ap.add_argument("--cpu", action="store_true", help="tiny CPU smoke run (reference backend)")
    ap.add_argument("--backend", default=None, help="backend of the quantized layers (default: auto; --cpu: reference)")
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    args.schemes = [s for s in args.schemes.split(",") if s]
    # under TRITON_INTERPRET=1 "auto" would pick the (very slow) interpreted kernels for the CPU smoke run
    args.backend = args.backend or ("reference" if args.cpu else "auto")
    threads = torch.get_num_threads()
    if args.cpu:
        args.hidden, args.layers, args.vocab, args.reps = 256, 2, 512, 3
        torch.set_num_threads(1)  # tiny matmuls: thread hand-offs cost more than they save (minutes on 2 cores)
    elif not torch.cuda.is_available():
        print("benchmarks.e2e needs a CUDA GPU (or --cpu for the smoke run)", file=sys.stderr)
        return 2
    try:
        result = run(args)
    finally:
        torch.set_num_threads(threads)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if any(k.endswith("error") for r in result["records"] for k in r) else 0


if __name__ == "__main__":
    sys.exit(main())
