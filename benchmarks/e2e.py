"""End-to-end decode speed of a quantized HF model vs bf16: ``python3 -m benchmarks.e2e``.

A random Llama-shaped model (built from config, no hub) is run one token at a time -- a decode step without a
KV cache, so the time is the weight-streaming GEMMs a real decode step is made of, plus norms and activations.
Each scheme is applied with ``ht.replace_linear``; every variant is timed eagerly and as a replayed CUDA graph
(what serving engines do), optionally under ``torch.compile(fullgraph=True)`` too; the output is checked
against the dequantized-weight model before timing.  Prints tokens/s and the ratio to bf16, writes JSON.

``--generate``: also a real HF ``generate`` loop with a static KV cache (greedy, prompt of ``--prompt-len``,
``--new-tokens`` tokens), eager and compiled (transformers' own decode compile, ``mode="reduce-overhead"``); decode
tokens/s vs bf16 per variant; rows under ``generate`` in the JSON.

``--cpu``: a tiny model on the CPU (reference backend) -- the smoke mode CI runs; its times mean nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
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

    def replay(graph=graph, static_ids=static_ids, out=out):  # the graph reads and writes these addresses:
        graph.replay()  # they must outlive it (a freed input buffer handed to another tensor is garbage ids)
    return replay, out


def _retime_interleaved(timers, device, reps: int) -> None:
    """Time every (variant, mode) once per round, ``reps`` rounds, and keep the medians: the H200 machine's host
    speed drifts by tens of % within minutes (benchmarks/results/h200/host/), which a variant timed minutes after
    bf16 reads as its own speed."""
    times = [[] for _ in timers]
    for _ in range(reps):
        for i, (_, _, fn) in enumerate(timers):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.no_grad():
                a.record()
                fn()
                b.record()
            torch.cuda.synchronize()
            times[i].append(a.elapsed_time(b) / 1e3)
    for (rec, key, _), ts in zip(timers, times):
        rec[key + "_sequential"] = rec[key]
        rec[key] = sorted(ts)[len(ts) // 2]


def _opt_in_switches() -> dict:
    """Compiled variants timed beside the baseline compile (--compile-triton / --compile-native / --table-defaults):
    key -> (its flag, a context that sets the switches for it).  The switches are module globals that dynamo guards,
    so each variant's graph coexists with the baseline's."""
    from cutlass_ext import native_op
    from humming_triton.kernels import compiled
    return {"compile_triton": ("compile_triton", lambda: switched_on(compiled)),  # the triton_op path
            "compile_native": ("compile_native", lambda: switched_on(native_op)),  # the C++ host path
            "compile_table": ("table_defaults", as_the_table_says)}  # this device's defaults


OPT_IN_COMPILES = ("compile_triton", "compile_native", "compile_table")


@contextlib.contextmanager
def _every_switch(on: bool | None):
    """Every switch of humming_triton/switches.py set to ``on`` for the duration, then restored."""
    from cutlass_ext import native_op
    from humming_triton.kernels import compiled, moe
    modules = (native_op, compiled, moe)
    before = [m.ON for m in modules]
    for m in modules:
        m.set_enabled(on)
    try:
        yield
    finally:
        for m, was in zip(modules, before):
            m.set_enabled(was)


def as_the_table_says():
    """Every switch unset for the duration: each path on exactly where this device's table turns it on -- the
    library's default here (humming_triton/switches.py), timed as a whole against the all-off baseline."""
    return _every_switch(None)


@contextlib.contextmanager
def switched_on(module):
    """``module.ON`` (an opt-in switch) on for the duration."""
    before = module.ON
    module.set_enabled(True)
    try:
        yield
    finally:
        module.set_enabled(before)


def _opt_in_eager() -> dict:
    """Opt-in paths timed beside the default eager (and graphed) run: flag -> (name, switch module, graphed too)."""
    from cutlass_ext import native_op
    from humming_triton.kernels import moe as moe_kernels
    return {"moe_pipeline": ("pipeline", lambda: switched_on(moe_kernels), True),  # routing / activation / combine
            "eager_native": ("native", lambda: switched_on(native_op), False),  # the C++ host path (same kernels)
            "table_defaults": ("table", as_the_table_says, True)}  # this device's defaults, all together


def _time_switched(rec: dict, name: str, setting, graphed: bool, model, ids, logits, device, args, timers) -> None:
    """The model eager (and replayed from a CUDA graph captured in it) in the switch ``setting`` (a context),
    interleaved with the baseline's: keys ``eager_<name>_s`` / ``graph_<name>_s``."""
    def eager(model=model):
        with setting():
            return model(ids, use_cache=False)
    try:
        with torch.no_grad():
            rec[f"eager_{name}_s"] = _time(eager, device, args.reps)
            timers.append((rec, f"eager_{name}_s", eager))
            out = eager().logits.float()
        rec[f"{name}_rel_diff_vs_eager"] = float((out - logits).norm() / logits.norm())
        if graphed:
            with setting():  # captured in the setting: the graph holds that path's kernels
                replay, _ = _graphed(model, ids)
            rec[f"graph_{name}_s"] = _time(replay, device, args.reps)
            timers.append((rec, f"graph_{name}_s", replay))
    except Exception as e:  # noqa: BLE001
        rec[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]


def _room_for_every_graph():
    """Each scheme x opt-in switch is one more graph of the same model code (1 + 3 x 3 with both opt-ins): past
    dynamo's recompile limit (8) a variant would silently run eagerly.  Room for all of them while the run lasts,
    and an error instead of a silent eager fallback should it still be exceeded."""
    cfg = torch._dynamo.config
    limit = next(n for n in ("recompile_limit", "cache_size_limit") if hasattr(cfg, n))  # torch >= 2.7, older
    patch = {limit: max(64, getattr(cfg, limit))}
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        patch["fail_on_recompile_limit_hit"] = True
    return cfg.patch(**patch)


def every_switch_off():
    """Every switch of humming_triton/switches.py off for the duration: the baseline variants (eager / graph /
    compile) run the Python host path and the torch MoE steps whatever this device's table turns on, and each
    opt-in variant turns its own switch on (``switched_on``) -- a same-run A/B of that path alone."""
    return _every_switch(False)


def run(args) -> dict:
    with _room_for_every_graph(), every_switch_off():
        return _run(args)


def _run(args) -> dict:
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    base = build(args.model, args.hidden, args.layers, args.vocab, device, dtype)
    ids = torch.randint(0, args.vocab, (args.batch, 1), device=device)
    records, gen_rows, timers = [], [], []
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
                timers.append((rec, "eager_s", lambda model=model: model(ids, use_cache=False)))
        except Exception as e:  # noqa: BLE001 -- a failing variant is a row, not a crash
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        # each faster mode on its own: one failing (e.g. a host sync under capture) must not hide the others
        if "error" not in rec and device.type == "cuda":
            try:
                replay, out = _graphed(model, ids)
                rec["graph_s"] = _time(replay, device, args.reps)
                timers.append((rec, "graph_s", replay))
                rec["graph_rel_diff_vs_eager"] = float((out.float() - logits).norm() / logits.norm())
            except Exception as e:  # noqa: BLE001
                rec["graph_error"] = f"{type(e).__name__}: {e}"[:300]
        for flag, (opt, setting, graphed) in _opt_in_eager().items():
            if "error" in rec or not getattr(args, flag) or not scheme or device.type != "cuda" or \
                    (flag == "moe_pipeline" and args.model != "qwen3_moe"):
                continue
            _time_switched(rec, opt, setting, graphed, model, ids, logits, device, args, timers)
        if "error" not in rec and args.compile:
            try:
                compiled = torch.compile(model, fullgraph=True)
                with torch.no_grad():
                    rec["compile_s"] = _time(lambda: compiled(ids, use_cache=False), device, args.reps)
                    timers.append((rec, "compile_s", lambda compiled=compiled: compiled(ids, use_cache=False)))
                    out = compiled(ids, use_cache=False).logits.float()
                # inductor fuses the bf16 norms / activations differently from eager: report the size of it
                rec["compile_rel_diff_vs_eager"] = float((out - logits).norm() / logits.norm())
            except Exception as e:  # noqa: BLE001
                rec["compile_error"] = f"{type(e).__name__}: {e}"[:300]
        for key, (flag, setting) in _opt_in_switches().items():
            if "error" in rec or not args.compile or not getattr(args, flag) or not scheme or device.type != "cuda":
                continue
            try:  # a variant: its switches set while its copy is traced and called (a guard selects its graph)
                twin = torch.compile(copy.deepcopy(model), fullgraph=True)

                def call_twin(twin=twin, setting=setting):
                    with setting():
                        return twin(ids, use_cache=False)
                with torch.no_grad():
                    rec[key + "_s"] = _time(call_twin, device, args.reps)
                    timers.append((rec, key + "_s", call_twin))
                    out = call_twin().logits.float()
                rec[key + "_rel_diff_vs_eager"] = float((out - logits).norm() / logits.norm())
            except Exception as e:  # noqa: BLE001
                rec[key + "_error"] = f"{type(e).__name__}: {e}"[:300]
        records.append(rec)
        print(_row(rec, records[0]), flush=True)
        if args.generate and "error" not in rec:
            for g in _generate_rows(model, base, scheme, args, device):
                g = {"model": args.model, "scheme": name, "hidden": args.hidden, "layers": args.layers,
                     "batch": args.batch, **g}
                bf16 = next((r for r in gen_rows if r["scheme"] == "bf16" and r["variant"] == g["variant"]), g)
                if "decode_s" in g and "decode_s" in bf16:  # each variant against bf16 run the same way
                    g["decode_ratio_vs_bf16"] = bf16["decode_s"] / g["decode_s"]
                gen_rows.append(g)
                print(_gen_row(g), flush=True)
    note = "decode step without KV cache: tokens/s = batch / step time"
    if args.interleave and device.type == "cuda":
        _retime_interleaved(timers, device, args.reps)
        note += ("; eager / graph / compile times: medians of rounds that time every variant once in turn "
                 "(bf16 beside ours at the same moment of the host's load), the first sequential pass in *_s_sequential")
        print("interleaved (every variant once per round, medians):")
        for rec in records:
            print(_row(rec, records[0]), flush=True)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "records": records, "note": note}
    if args.generate:
        import transformers
        result["transformers"] = transformers.__version__
        result["generate"] = gen_rows
        result["generate_note"] = ("HF generate, greedy, static KV cache: prefill_s = generate with 1 new token; "
                                   "decode_s = (generate(N) - generate(1)) / (N - 1); decode_tok_s = batch / decode_s")
    return result

# ---------------------------------------------------------------------------------------------------------------
# --generate: HF's own decode loop with a static KV cache
#
# transformers 5.x auto-compiles the *decode* forward (not the prefill) whenever generate runs with a compileable
# (static) cache on a GPU, using generation_config.compile_config (default mode "reduce-overhead" = CUDA graphs).
# So "eager" must say disable_compile=True to be eager, and "compiled" passes an explicit CompileConfig.
# The cache is one StaticCache object per (model, variant), reset before every call: a fresh cache per call (what
# cache_implementation="static" does) gives the CUDA graphs new cache addresses each call, which can re-record them.


def _gen_config(new_tokens: int, compiled: bool, **extra):
    from transformers import CompileConfig, GenerationConfig
    return GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
        disable_compile=not compiled,
        compile_config=CompileConfig(fullgraph=True, mode="reduce-overhead") if compiled else None, **extra)


def _generate(model, ids, cache, cfg):
    """One greedy generate call on the reused static cache (the cache kwarg was renamed past_key_values -> cache)."""
    kw = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    cache.reset()
    return model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg, **{kw: cache})


def _wall(fn, device) -> float:
    """Wall seconds of one ``fn()``: generate syncs with the host every step anyway, so the host clock is the truth."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _time_generate(model, ids, args, device, compiled: bool) -> dict:
    """prefill_s = generate(1 new token) (one forward: the prefill); decode_s = the extra time of generate(N) over
    generate(1), per decode step (N - 1 of them).  Medians over --gen-reps alternating calls."""
    from transformers import StaticCache
    n = args.new_tokens
    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + n)
    cfg_n, cfg_1 = _gen_config(n, compiled), _gen_config(1, compiled)
    if compiled:
        # every model's __call__ is one code object to dynamo: without a reset, bf16 + 4 schemes (+ --compile's
        # graphs) can pass its recompile limit (8), after which it would silently run eagerly
        torch._dynamo.reset()
    t_n, t_1 = [], []
    with torch.no_grad():
        for _ in range(2):  # warm-up; compiled: the first call compiles, the next record / replay the CUDA graphs
            out = _generate(model, ids, cache, cfg_n)
            _generate(model, ids, cache, cfg_1)
        for _ in range(args.gen_reps):
            t_n.append(_wall(lambda: _generate(model, ids, cache, cfg_n), device))
            t_1.append(_wall(lambda: _generate(model, ids, cache, cfg_1), device))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    prefill, total = med(t_1), med(t_n)
    decode = max(total - prefill, 1e-9) / max(n - 1, 1)
    return {"prefill_s": prefill, "generate_s": total, "decode_s": decode, "decode_tok_s": args.batch / decode,
            "tokens": out[:, ids.shape[1]:].tolist()}


def _generate_rows(model, base, scheme, args, device) -> list:
    """The eager and compiled generate rows of one variant; for a quantized model also the token check."""
    torch.manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt_len), device=device)
    # a random model would stop at whatever it thinks is EOS: no EOS at all (min_new_tokens is the second belt)
    model.generation_config.eos_token_id = None
    rows, eager_tokens = [], None
    for variant in ("eager", "compiled"):
        row = {"variant": variant, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens}
        rows.append(row)
        if variant == "compiled" and device.type != "cuda":
            # reduce-overhead = CUDA graphs, which the CPU has not; inductor's C++ codegen instead took 17 s for the
            # 2-layer bf16 smoke model alone (transformers also refuses to auto-compile on CPU unless forced)
            row["skipped"] = ("compiled generate needs a CUDA GPU (mode='reduce-overhead' is CUDA graphs; "
                              "inductor on CPU compiles for ~17 s per model, too slow for the smoke run)")
            continue
        try:
            row.update(_time_generate(model, ids, args, device, compiled=variant == "compiled"))
            if variant == "eager":
                eager_tokens = row["tokens"]
                if scheme:
                    row.update(_token_check(model, base, ids, args))
            elif eager_tokens is not None:  # inductor may round bf16 differently: report, do not fail
                row["tokens_match_eager"] = _leading_match(row["tokens"], eager_tokens)
        except Exception as e:  # noqa: BLE001 -- a failing variant is a row, not a crash
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            # generate caches its compiled forward on the model; a later deepcopy must not inherit it
            for attr in ("_compiled_call", "_last_compile_config"):
                model.__dict__.pop(attr, None)
        row.pop("tokens", None)
    return rows


def _leading_match(a: list, b: list) -> int:
    """How many leading tokens agree in every sequence of the batch."""
    n = 0
    while all(n < len(x) and n < len(y) and x[n] == y[n] for x, y in zip(a, b)):
        n += 1
    return n


def _token_check(qmodel, base, ids, args) -> dict:
    """Greedy tokens of the quantized model vs its dequantized twin (eager), and the prefill logits' relative error.
    In fp32 on the CPU they agree; in bf16 on a GPU a random model's near-tied logits may flip a later token."""
    twin = _dequantized_twin(qmodel, base)
    twin.generation_config.eos_token_id = None
    from transformers import StaticCache
    cfg = _gen_config(args.new_tokens, False, return_dict_in_generate=True, output_logits=True)
    outs = []
    with torch.no_grad():
        for m in (qmodel, twin):
            cache = StaticCache(config=m.config, max_cache_len=ids.shape[1] + args.new_tokens)
            outs.append(_generate(m, ids, cache, cfg))
    q, t = (o.sequences[:, ids.shape[1]:].tolist() for o in outs)
    lq, lt = outs[0].logits[0].float(), outs[1].logits[0].float()
    checked = min(args.check_tokens, args.new_tokens)
    matched = _leading_match(q, t)
    return {"tokens_matched": matched, "tokens_checked": checked, "tokens_ok": matched >= checked,
            "first_logits_rel_err": float((lq - lt).norm() / lt.norm())}


def _gen_row(row: dict) -> str:
    head = f"{row['scheme']:>10} generate {row['variant']:>8}:"
    if "skipped" in row:
        return f"{head} skipped: {row['skipped']}"
    if "error" in row:
        return f"{head} failed: {row['error']}"
    ratio = f"{row['decode_ratio_vs_bf16']:.2f}x" if "decode_ratio_vs_bf16" in row else "n/a"
    out = f"{head} decode {row['decode_tok_s']:8.1f} tok/s ({ratio} bf16)  prefill {row['prefill_s'] * 1e3:.1f} ms"
    if "tokens_matched" in row:
        out += (f"  tokens vs dequantized {row['tokens_matched']}/{row['new_tokens']}"
                f"{'' if row['tokens_ok'] else ' [MISMATCH in the first %d]' % row['tokens_checked']}"
                f"  logits err {row['first_logits_rel_err']:.1e}")
    if row.get("tokens_match_eager") is not None:
        out += f"  tokens vs eager {row['tokens_match_eager']}/{row['new_tokens']}"
    return out


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
    fails = "".join(f"  [{k}: {rec[k]}]" for k in ("graph_error", "compile_error", "pipeline_error", "native_error",
                                                   "table_error", *(o + "_error" for o in OPT_IN_COMPILES)) if k in rec)
    parts = [f"{rec['scheme']:>10}:"]
    for key in ("eager_s", "graph_s", "compile_s", *(o + "_s" for o in OPT_IN_COMPILES), "eager_pipeline_s",
                "graph_pipeline_s", "eager_native_s", "eager_table_s", "graph_table_s"):
        if key in rec:
            tps = rec["batch"] / rec[key]
            # against bf16 run the same way (its eager / graph / compile time)
            base = "compile_s" if key.startswith("compile") else \
                key.replace("_pipeline", "").replace("_native", "").replace("_table", "")
            ratio = bf16.get(base, rec[key]) / rec[key]
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
    ap.add_argument("--no-interleave", dest="interleave", action="store_false",
                    help="GPU: keep the sequential pass's times (default: re-time every variant in interleaved rounds)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(fullgraph=True)")
    ap.add_argument("--compile-triton", action="store_true",
                    help="GPU, with --compile: also time each quantized model compiled with the opt-in triton_op path "
                         "(kernels.compiled.ON), interleaved with the default: a same-run A/B")
    ap.add_argument("--compile-native", action="store_true",
                    help="GPU, with --compile: also time each quantized model compiled with the opt-in C++ host path "
                         "(cutlass_ext.native_op.ON), interleaved with the default: a same-run A/B")
    ap.add_argument("--moe-pipeline", action="store_true",
                    help="GPU, qwen3_moe: also time each quantized model eager and graphed with the opt-in MoE "
                         "pipeline (kernels/moe.py, HUMMING_TRITON_MOE_PIPELINE), interleaved: a same-run A/B")
    ap.add_argument("--eager-native", action="store_true",
                    help="GPU: also time each quantized model eager with the opt-in C++ host path "
                         "(cutlass_ext.native_op.ON), interleaved: a same-run A/B")
    ap.add_argument("--table-defaults", action="store_true",
                    help="GPU: also time each quantized model eager, graphed and (with --compile) compiled with every "
                         "switch as this device's table sets it -- the library's default here -- interleaved with the "
                         "all-off baseline")
    ap.add_argument("--generate", action="store_true",
                    help="also time HF generate with a static KV cache, eager and compiled (reduce-overhead)")
    ap.add_argument("--prompt-len", type=int, default=32, help="--generate: prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=64, help="--generate: tokens generated per call")
    ap.add_argument("--gen-reps", type=int, default=5, help="--generate: timed generate calls (median)")
    ap.add_argument("--check-tokens", type=int, default=4,
                    help="--generate: leading greedy tokens that must equal the dequantized twin's")
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
        args.prompt_len, args.new_tokens, args.gen_reps = min(args.prompt_len, 8), min(args.new_tokens, 6), 2
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
    return 1 if any(k.endswith("error") for r in result["records"] + result.get("generate", []) for k in r) else 0


if __name__ == "__main__":
    sys.exit(main())
