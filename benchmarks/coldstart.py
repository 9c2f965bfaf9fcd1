"""Cold start: a fresh process with an empty Triton cache, timed from ``import humming_triton`` to the first
correct output of a new W4A16 8192x8192 layer -- then the same with the cache that run left behind.

Why a subprocess: in the benchmark process the kernels are already compiled and imported, which is exactly
what a server restarting (or meeting a new layer shape) does not have.  ``TRITON_CACHE_DIR`` points at a new
temporary directory so nothing compiled earlier on this machine is reused.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

N = K = 8192
M = 16


def _child() -> None:
    t0 = time.perf_counter()
    import torch
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    import humming_triton as ht
    t2 = time.perf_counter()
    g = torch.Generator(device="cuda").manual_seed(7)
    w = (torch.randn(N, K, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    qw = ht.quantize_weight(w, "w4a16")
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    y = ht.quant_linear(x, qw)
    torch.cuda.synchronize()
    t5 = time.perf_counter()
    backend = ht.last_backend("quant_linear")
    ref = ht.reference_linear(x, qw, out_dtype=torch.float32)
    err = float((y.double() - ref.double()).norm() / ref.double().norm())
    t6 = time.perf_counter()
    ht.quant_linear(x, qw)
    torch.cuda.synchronize()
    t7 = time.perf_counter()
    print("COLDSTART_JSON " + json.dumps({
        "torch_init_s": t1 - t0, "import_s": t2 - t1, "quantize_s": t4 - t3, "first_call_s": t5 - t4,
        "to_first_output_s": (t2 - t1) + (t4 - t3) + (t5 - t4), "second_call_s": t7 - t6,
        "backend": backend, "rel_err": err, "correct": bool(err < 1e-2) and backend == "triton"}), flush=True)


def _run(cache_dir: str, timeout: float) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir)
    env.pop("TRITON_INTERPRET", None)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    try:
        p = subprocess.run([sys.executable, "-m", "benchmarks.coldstart", "--child"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith("COLDSTART_JSON "):
            return json.loads(line[len("COLDSTART_JSON "):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {p.returncode}: " + " / ".join(tail)[:400]}


def measure_cold_start(timeout: float = 180.0) -> dict:
    """{"empty_cache": {...}, "warm_cache": {...}} -- seconds per phase, backend used, correctness."""
    with tempfile.TemporaryDirectory(prefix="ht_triton_cache_") as d:
        cold = _run(d, timeout)
        warm = _run(d, timeout)
    return {"shape": f"w4a16 N={N} K={K} M={M}", "empty_cache": cold, "warm_cache": warm}


if __name__ == "__main__" and "--child" in sys.argv:
    _child()
