"""How a call is timed, and the device's own ceilings.

* GPU: the call is captured once in a CUDA graph and the graph is replayed -- that is how serving engines run
  decode, and it removes the Python/launch gaps that would otherwise dominate small-M times.  Before every
  replay a 256 MB buffer is overwritten so the weight cannot sit in the 60 MB L2 (a single layer's weight fits
  there and would fake a bandwidth no model sees).  CUDA events bracket only the replay; the median of many
  replays is reported.  A call that cannot be captured (it synchronizes, say) is timed the same way without
  the graph, and the record says so.
* CPU (``--interpret`` smoke mode only): ``time.perf_counter`` around each call, median.
* Ceilings, measured at the start of a run because absolute rates vary between machines: device-to-device
  copy (bytes read + bytes written), bf16 ``torch.mm`` and fp8 ``torch._scaled_mm`` at 8192^3.
"""
from __future__ import annotations

import statistics
import time

import torch

__all__ = ["time_gpu", "time_configs", "time_cpu", "measure_ceilings"]

FLUSH_BYTES = 256 << 20
_flush_buf = None


def _flush() -> None:
    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    _flush_buf.zero_()


def _replay_times(run, reps: int) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        _flush()
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]  # µs


def time_gpu(fn, *, use_graph: bool = True, budget_s: float = 0.25, min_reps: int = 25,
             max_reps: int = 400) -> dict:
    """Median µs of ``fn()`` (already warmed up by the caller) -> {"us", "reps", "timing", "spread"}."""
    torch.cuda.synchronize()
    run, how, graph = fn, "events", None
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            torch.cuda.synchronize()
            run, how = graph.replay, "cuda_graph"
        except Exception as e:  # noqa: BLE001 -- uncapturable call: time it eagerly instead
            graph = None
            torch.cuda.synchronize()
            how = f"events (graph capture failed: {type(e).__name__})"
    est = statistics.median(_replay_times(run, 3))
    # each rep also pays the flush (~0.1 ms); keep a case near budget_s
    reps = int(max(min_reps, min(max_reps, budget_s * 1e6 / (est + 100.0))))
    t = _replay_times(run, reps)
    del graph
    q = statistics.quantiles(t, n=10) if len(t) >= 10 else [min(t), max(t)]
    return {"us": statistics.median(t), "reps": reps, "timing": how, "spread": (q[-1] - q[0]) / statistics.median(t)}


def time_configs(configs, run, ref, *, budget_s: float = 0.03, min_reps: int = 20):
    """Time ``run(cfg)`` for each config -> (timed, failed): ``timed`` sorted [(µs, cfg.describe(), rel. error
    against ``ref``)], ``failed`` [[cfg.describe(), first line of the error]] for configs the library refuses
    (recorded, not fatal; a sticky CUDA error still is)."""
    timed, failed = [], []
    for cfg in configs:
        fn = lambda cfg=cfg: run(cfg)  # noqa: E731
        try:
            y = fn()
        except (RuntimeError, ValueError) as e:
            failed.append([cfg.describe(), str(e).splitlines()[0][:200]])
            continue
        rel = float((y.float() - ref).norm() / ref.norm())
        timed.append((time_gpu(fn, budget_s=budget_s, min_reps=min_reps)["us"], cfg.describe(), rel))
    timed.sort()
    return timed, failed


def time_cpu(fn, reps: int = 5) -> dict:
    fn()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e6)
    return {"us": statistics.median(t), "reps": reps, "timing": "perf_counter (cpu)", "spread": None}


def _median_ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    return time_gpu(fn, use_graph=False, min_reps=reps, max_reps=reps, budget_s=0)["us"] / 1e3


def measure_ceilings() -> dict:
    """Copy GB/s (read + write), bf16 and fp8 matmul TFLOP/s; a failed probe is recorded, not fatal."""
    out: dict = {}
    try:
        n = 1 << 29  # 1 GiB of bf16 per buffer: far past L2
        a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
        b = torch.empty_like(a)
        ms = _median_ms(lambda: b.copy_(a), 20)
        out["copy_gbps"] = 2 * a.numel() * a.element_size() / ms / 1e6
        del a, b
    except Exception as e:  # noqa: BLE001
        out["copy_error"] = f"{type(e).__name__}: {e}"
    s = 8192
    flops = 2 * s ** 3
    try:
        a = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
        ms = _median_ms(lambda: torch.mm(a, b), 20)
        out["bf16_tflops"] = flops / ms / 1e9
    except Exception as e:  # noqa: BLE001
        out["bf16_error"] = f"{type(e).__name__}: {e}"
    try:
        a8 = torch.randn(s, s, device="cuda").to(torch.float8_e4m3fn)
        b8 = torch.randn(s, s, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        one = torch.ones((), device="cuda", dtype=torch.float32)
        ms = _median_ms(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), 20)
        out["fp8_tflops"] = flops / ms / 1e9
    except Exception as e:  # noqa: BLE001
        out["fp8_error"] = f"{type(e).__name__}: {e}"
    torch.cuda.empty_cache()
    return out
