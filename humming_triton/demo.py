"""The README's main job: ``python3 -m humming_triton.demo [--quick]``.

1. One linear layer (4096 x 4096; 1024 x 1024 with ``--quick``) quantized with several presets: relative error
   of the layer output against the bf16 layer, weight memory, and which backend ran (``ht.last_backend()``).
2. A tiny random Llama and a tiny Qwen3-MoE built from config (no hub access; dims multiples of 128, 2 layers):
   quantized through ``ht.replace_linear``, written with ``ht.save_quantized`` in an external format (GPTQ v2 or
   compressed-tensors), read back with ``ht.load_quantized``, then a forward pass and a short greedy
   ``generate``.  Printed: logit error against the bf16 model, whether the reloaded model reproduces the
   in-memory quantized one exactly, greedy-token agreement with bf16, and the backends used.

Why this shape: it exercises the whole path a user takes (quantize -> export -> import -> run) on whatever
machine it lands on.  On CPU every op runs the torch reference; on a CUDA machine the same command puts the
models on the GPU and ``backend="auto"`` picks the Triton kernels where they support the scheme.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import tempfile
import time
import warnings

import torch

import humming_triton as ht

LAYER_PRESETS = ("w4a16", "w4a16-asym", "w8a16", "w3a16", "mxfp4", "nvfp4", "w8a8-fp8")
# (model, preset, export format); --quick keeps the first rows of each model
MODEL_RUNS = (
    ("llama", "w4a16", "gptq"), ("llama", "nvfp4", "compressed-tensors"), ("llama", "w4a16-asym", "gptq"),
    ("llama", "w3a16", "gptq"), ("llama", "w8a16", "compressed-tensors"), ("llama", "mxfp4", "compressed-tensors"),
    ("qwen3_moe", "w4a16", "gptq"), ("qwen3_moe", "mxfp4", "compressed-tensors"),
    ("qwen3_moe", "w4a16-asym", "compressed-tensors"),
)
QUICK_RUNS = 2  # rows per model with --quick
INIT_STD = 0.02  # HF's initializer_range


def _progress(items, desc: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, leave=False, file=sys.stderr)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def _table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# --- part 1: one layer -----------------------------------------------------------------------------------------
def layer_demo(n: int, k: int, tokens: int, device: torch.device, backend: str = "auto") -> str:
    g = torch.Generator(device="cpu").manual_seed(0)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16).to(device)
    x = torch.randn(tokens, k, generator=g).to(torch.bfloat16).to(device)
    y_ref = torch.nn.functional.linear(x, w)
    bf16_mib = w.numel() * 2 / 2 ** 20
    rows = []
    for preset in _progress(LAYER_PRESETS, f"layer {n}x{k}"):
        qw = ht.quantize_weight(w, preset)
        y = ht.quant_linear(x, qw, backend=backend)  # first call: picks the backend (builds views / compiles)
        _sync(device)
        t0 = time.perf_counter()
        y = ht.quant_linear(x, qw, backend=backend)
        _sync(device)
        ms = (time.perf_counter() - t0) * 1e3
        rows.append([preset, f"{qw.nbytes() / 2 ** 20:.2f} ({bf16_mib / (qw.nbytes() / 2 ** 20):.1f}x)",
                     f"{_rel(y, y_ref):.2e}", ht.last_backend("quant_linear"), f"{ms:.2f}"])
    return _table(["preset", "weight MiB (vs bf16)", "rel err vs bf16", "backend", "ms/call"], rows)


# --- part 2: tiny models ---------------------------------------------------------------------------------------
def build_model(kind: str):
    """A tiny random causal LM from config (seeded, so every preset starts from the same bf16 weights)."""
    import transformers
    common = dict(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=128, max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(intermediate_size=512, **common)
    else:
        cfg = transformers.Qwen3MoeConfig(intermediate_size=512, moe_intermediate_size=128, num_experts=8,
                                          num_experts_per_tok=2, **common)
    torch.manual_seed(0)
    # built exactly as load_quantized builds its skeleton (bf16 parameters, fp32 rotary buffers), so that a
    # reloaded model can be compared bit for bit with the in-memory quantized one
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, INIT_STD)
    return model.eval()


def _generate(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=0)
    return out[:, ids.shape[1]:]


def model_demo(runs, device: torch.device, new_tokens: int, backend: str = "auto") -> str:
    rows, base = [], {}
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(1, 512, (2, 12), generator=g).to(device)
    for kind, preset, fmt in _progress(runs, "tiny models"):
        t0 = time.perf_counter()
        if kind not in base:
            ref = build_model(kind).to(device)
            with torch.no_grad():
                base[kind] = (ref, ref(ids).logits.float(), _generate(ref, ids, new_tokens))
        ref, ref_logits, ref_tokens = base[kind]
        quant = ht.replace_linear(copy.deepcopy(ref), preset, backend=backend)
        with tempfile.TemporaryDirectory() as d, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ht.save_quantized(quant, d, format=fmt)
            loaded = ht.load_quantized(d, dtype=torch.bfloat16, backend=backend).to(device).eval()
        inexact = any("reciprocal" in str(c.message) for c in caught)
        with torch.no_grad():
            in_memory = quant(ids).logits.float()
            logits = loaded(ids).logits.float()
            backends = f"linear={ht.last_backend('quant_linear')}"
            if kind == "qwen3_moe":
                backends += f" moe={ht.last_backend('fused_moe')}"
            tokens = _generate(loaded, ids, new_tokens)
        same = torch.equal(logits, in_memory)
        exact = "yes" if same else ("1ulp-gs" if inexact else f"no ({_rel(logits, in_memory):.0e})")
        agree = int((tokens == ref_tokens).sum())
        rows.append([kind, preset, fmt, f"{_rel(logits, ref_logits):.2e}", exact, f"{agree}/{tokens.numel()}",
                     backends, f"{time.perf_counter() - t0:.1f}"])
    note = ("exact reload = reloaded logits equal the in-memory quantized model's (1ulp-gs: an NVFP4 global scale "
            "with no exact float32 reciprocal, see save_quantized).\nRandom weights give near-flat logits, so greedy "
            "tokens diverge from bf16 after the first flip; the logit error is the meaningful column.")
    return _table(["model", "preset", "saved as", "logit rel err vs bf16", "exact reload",
                   "greedy tokens = bf16", "backends", "s"], rows) + "\n" + note


def backend_problem(backend: str, device: torch.device) -> str | None:
    """None when ``backend`` can run every layer preset on ``device``, else dispatch's sentence saying why not.
    Why up front: the same question asked on a tiny weight before any work, so an impossible ``--backend`` (triton
    on a CPU machine) is one line and a non-zero exit instead of a traceback from deep inside part 1."""
    x = torch.zeros(1, 128, dtype=torch.bfloat16, device=device)
    w = torch.zeros(128, 128, dtype=torch.bfloat16, device=device)
    for preset in LAYER_PRESETS:
        try:
            ht.select_backend("quant_linear", x, ht.quantize_weight(w, preset), backend)
        except (RuntimeError, ValueError) as e:
            return str(e)
    return None


@contextlib.contextmanager
def _cpu_threads(n: int | None):
    """Tiny models on CPU are per-op overhead, not FLOPs: extra intra-op threads only spin-wait, and on a busy
    machine (e.g. next to a test run) that made part 2 ~30x slower.  One thread for that part, then restore."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m humming_triton.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller layer, fewer presets per model (CI)")
    ap.add_argument("--device", default="auto", help="auto (cuda if available) | cpu | cuda")
    ap.add_argument("--size", type=int, default=None, help="layer N = K (default 4096; 1024 with --quick)")
    ap.add_argument("--backend", default="auto", help="auto | reference | triton: the backend of every quantized op "
                    "(triton on a GPU runs the kernels even where auto still prefers the reference)")
    args = ap.parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    size = args.size or (1024 if args.quick else 4096)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("humming_triton.demo: --device cuda but torch sees no CUDA GPU here", file=sys.stderr)
        return 2
    why = backend_problem(args.backend, device)
    if why:
        print(f"humming_triton.demo: --backend {args.backend} cannot run on {device}: {why}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(f"humming_triton {ht.__version__} demo on {device}{gpu}; torch {torch.__version__}; "
          f"backend={args.backend}{'; --quick' if args.quick else ''}")
    print(f"\n[1] one {size}x{size} linear layer, 16 tokens, bf16 activations")
    print(layer_demo(size, size, 16, device, args.backend))
    print(f"part 1 took {time.perf_counter() - t_start:.1f} s")
    try:
        import safetensors  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"\n[2] skipped: the tiny-model part needs the 'hf' extra (transformers, safetensors): {e}")
        return 0
    runs = MODEL_RUNS
    if args.quick:
        runs = tuple(r for kind in ("llama", "qwen3_moe") for r in [x for x in MODEL_RUNS if x[0] == kind][:QUICK_RUNS])
    print("\n[2] tiny random Llama / Qwen3-MoE (hidden 256, 2 layers): replace_linear -> save_quantized -> "
          "load_quantized -> forward + greedy generate (8 tokens x 2 prompts)")
    t_part = time.perf_counter()
    with _cpu_threads(1 if device.type == "cpu" else None):
        print(model_demo(runs, device, 8, args.backend))
    print(f"part 2 took {time.perf_counter() - t_part:.1f} s")
    print(f"\ndone in {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
