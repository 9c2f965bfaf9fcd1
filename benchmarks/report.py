"""Turning records into the committed artefacts: results.json, results.md and two PNG plots.

At most four files are written (the channel that brings results back from the GPU machine carries 8):
``results.json`` (everything, machine-checkable), ``results.md`` (tables a reader compares with
shared/targets.md), ``dense.png`` and ``moe.png`` (time vs M, one panel per scheme x shape, one line per method).
"""
from __future__ import annotations

import json
import math
import os
from collections import defaultdict

from .cases import ACT_FP8_SCHEMES

__all__ = ["add_peer_ratios", "write_json", "write_markdown", "write_plots", "dispatch_section", "method_names"]

OURS = "humming_triton"
INVARIANT = "humming_triton_invariant"  # ours in batch-invariant mode (opt-in method): a column, never a peer
PEER_COLS = {"dense": ("humming_triton_invariant", "cublas", "torch_scaled_mm", "humming", "gemlite"),
             "moe": ("humming_triton_invariant", "torch_grouped_mm", "humming")}
# (matplotlib hides legend labels that start with "_")
NAMES = {"humming_triton": "ours", "cublas": "cuBLAS bf16", "torch_scaled_mm": "scaled_mm fp8",
         "torch_grouped_mm": "grouped_mm bf16", "humming": "Humming", "gemlite": "gemlite",
         "humming_triton_invariant": "ours, batch-invariant"}
COLORS = {"humming_triton": "tab:red", "cublas": "tab:gray", "torch_scaled_mm": "tab:purple",
          "torch_grouped_mm": "tab:gray", "humming": "tab:blue", "gemlite": "tab:green",
          "humming_triton_invariant": "tab:orange"}


def method_names(records: list[dict]) -> dict[str, str]:
    """method -> the label its rows carry (what ran: e.g. torch's CPU matmul for "cublas" in the smoke mode),
    else NAMES (results files written before rows had labels)."""
    names = dict(NAMES)
    for r in records:
        if r.get("label"):
            names[r["method"]] = r["label"]
    return names


def _case_key(r: dict) -> tuple:
    return (r["kind"], r["N"], r["K"], r["M"], r.get("E"), r.get("topk"))


def add_peer_ratios(records: list[dict]) -> None:
    """``vs_best_peer`` on our rows = fastest peer µs / our µs (> 1: we are faster).  The peers of a row are the
    other methods on the same case with the same scheme, plus the unquantized bf16 baseline (cuBLAS or
    _grouped_mm) that every quantized format has to beat; the fp8 ``_scaled_mm`` row counts for w8a8-fp8."""
    groups = defaultdict(list)
    for r in records:
        groups[_case_key(r)].append(r)
    for r in records:
        if r["method"] != OURS or r["us"] is None:
            continue
        peers = [p for p in groups[_case_key(r)]
                 if p["method"] not in (OURS, INVARIANT) and p["us"] is not None and p["scheme"] in (r["scheme"], "bf16")]
        if peers:
            best = min(peers, key=lambda p: p["us"])
            r["vs_best_peer"] = best["us"] / r["us"]
            r["best_peer"] = best["method"]


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_json(path: str, meta: dict, records: list[dict]) -> None:
    doc = dict(meta)
    doc["records"] = [{k: _clean(v) for k, v in r.items()} for r in records]
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")


def _us(r: dict | None) -> str:
    if r is None:
        return ""
    return f"{r['us']:.1f}" if r["us"] is not None else "—"


def _f(v, fmt="{:.1f}") -> str:
    return "" if v is None else fmt.format(v)


def _cell(v) -> str:
    """A markdown table cell: a literal "|" (dispatch keys use it) is escaped, not taken as a column break."""
    return str(v).replace("|", "\\|")


def _table(kind: str, records: list[dict]) -> list[str]:
    rows = [r for r in records if r["kind"] == kind]
    if not rows:
        return []
    cols = [c for c in PEER_COLS[kind] if c != INVARIANT or any(r["method"] == INVARIANT for r in rows)]
    lines = []
    dense = kind == "dense"
    names = method_names(rows)
    head = (["scheme", "shape", "M", "**ours µs**"] + [names[c] for c in cols]
            + ["TFLOP/s", "GB/s", "% HBM"] + (["floor µs", "% floor"] if dense else [])
            + ["% TC", "rel err", "vs best peer", "path"])
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    index = defaultdict(dict)
    for r in rows:
        index[_case_key(r)][(r["method"], r["scheme"])] = r
    cases = []
    for r in rows:
        c = (r["scheme"], _case_key(r), r.get("gemm"))
        if r["scheme"] not in ("bf16",) and c not in cases:
            cases.append(c)
    for scheme, key, gemm in cases:
        got = index[key]
        ours = got.get((OURS, scheme))
        cells = []
        for c in cols:
            if c == "torch_scaled_mm" and scheme not in ACT_FP8_SCHEMES:
                cells.append("")
                continue
            want = {"cublas": "bf16", "torch_grouped_mm": "bf16", "torch_scaled_mm": "w8a8-fp8"}.get(c, scheme)
            cells.append(_us(got.get((c, want))))
        shape = f"{key[1]}×{key[2]}" if kind == "dense" else f"{gemm} {key[1]}×{key[2]} E{key[4]} top{key[5]}"
        o = ours or {}
        err = o.get("rel_err")
        floor = [_f(o.get("floor_us")), _f(o.get("pct_floor"), "{:.0f}")] if dense else []
        path = _cell(o.get("path") or "")
        lines.append("| " + " | ".join([scheme, shape, str(key[3]), f"**{_us(ours) or '—'}**"] + cells + [
            _f(o.get("tflops")), _f(o.get("gbps"), "{:.0f}"), _f(o.get("pct_hbm"))] + floor + [
            _f(o.get("pct_tc")), _f(err, "{:.1e}"), _f(o.get("vs_best_peer"), "{:.2f}×"), path]) + " |")
    return lines


def _config_summary(c: dict) -> str:
    """'triton/swapab bn=128 bk=128 sk=2' from one candidate of a dispatch entry."""
    cfg = " ".join(f"{SHORT.get(k, k)}={v}" for k, v in (c.get("config") or {}).items())
    return " ".join(x for x in (f"{c.get('backend', '?')}/{c.get('family', '?')}", cfg) if x)


SHORT = {"block_m": "bm", "block_n": "bn", "block_k": "bk", "split_k": "sk", "num_warps": "w",
         "num_stages": "st", "group_m": "gm"}


def dispatch_section(table: dict, source: str = "") -> list[str]:
    """Markdown for the "dispatch" section of autotune_configs/<device>.json: per key the measured winner
    (candidates are stored sorted by µs, [0] wins), the runner-up and how many candidates were measured."""
    if not table:
        return []
    L = ["## Dispatch table", "",
         f"From {source or 'the device config'}: the candidates the tuner measured per (op, scheme, shape, M "
         "bucket); the dispatcher runs the winner.", "",
         "| key | winner | µs | runner-up | µs | candidates | failed | measured with |", "|---|---|---|---|---|---|---|---|"]
    for key in sorted(table):
        e = table[key] if isinstance(table[key], dict) else {}
        cands = [c for c in e.get("candidates") or [] if isinstance(c, dict)]
        win = cands[0] if cands else {}
        run = cands[1] if len(cands) > 1 else {}
        env = ", ".join(f"{k} {e[k]}" for k in ("triton", "torch", "commit") if e.get(k))
        L.append("| " + " | ".join(_cell(x) for x in (
            key, _config_summary(win) if win else "—", _f(win.get("us")), _config_summary(run) if run else "",
            _f(run.get("us")), len(cands), len(e.get("failed") or []), env)) + " |")
    L.append("")
    return L


def write_markdown(path: str, meta: dict, records: list[dict], plots: list[str], dispatch: dict | None = None,
                   dispatch_source: str = "") -> str:
    c = meta.get("ceilings", {})
    L = [f"# humming_triton benchmark — {meta['device']}", "",
         f"suite `{meta['suite']}` · {meta['date']} · torch {meta['torch']} · triton {meta['triton']} · "
         f"commit {meta['git_commit']} · run {meta.get('wall_s', 0):.0f} s", "",
         "Times: median µs of CUDA-graph replays with L2 flushed between reps (CPU smoke mode: perf_counter). "
         "Every output was checked against a reference before timing. % HBM = achieved GB/s (packed weight + "
         "scales + x + y) / measured copy bandwidth; % TC = TFLOP/s / measured bf16 (or fp8 for fp8 "
         "activations) matmul rate. floor µs = a bare Triton kernel streaming the packed weight words "
         "(benchmarks/floor.py; GPU runs only), % floor = floor µs / our µs (100 = as fast as streaming the "
         "weight). vs best peer = fastest peer µs / our µs (> 1: ours faster). path = the backend/family/config "
         "our first call ran (`humming_triton.dispatch.last_plan`).", "",
         "Ceilings: " + ", ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k}: {v}" for k, v in c.items()),
         ""]
    cs = meta.get("cold_start")
    if cs and cs.get("skipped"):
        L += [f"Cold start: skipped ({cs['skipped']}).", ""]
    elif cs:
        L += ["## Cold start", "", f"Fresh process, `{cs.get('shape', '')}`: import + quantize + first correct output.",
              "", "| Triton cache | import s | quantize s | first call s | **to first output s** | backend | "
              "rel err | note |", "|---|---|---|---|---|---|---|---|"]
        for k in ("empty_cache", "warm_cache"):
            v = cs.get(k)
            if isinstance(v, dict):
                L.append(f"| {k.replace('_cache', '')} | {_f(v.get('import_s'), '{:.2f}')} | "
                         f"{_f(v.get('quantize_s'), '{:.2f}')} | {_f(v.get('first_call_s'), '{:.2f}')} | "
                         f"**{_f(v.get('to_first_output_s'), '{:.2f}')}** | {v.get('backend', '')} | "
                         f"{_f(v.get('rel_err'), '{:.1e}')} | {str(v.get('error', '')).replace('|', '/')} |")
        L.append("")
    for kind, title in (("dense", "Dense"), ("moe", "MoE grouped GEMM (routed rows sorted by expert)")):
        t = _table(kind, records)
        if t:
            L += [f"## {title}", ""] + t + [""]
    if meta.get("compare"):
        from .compare import format_markdown
        L += format_markdown(meta["compare"])
    L += dispatch_section(dispatch or {}, dispatch_source)
    fails = defaultdict(int)
    for r in records:
        if r["us"] is None:
            fails[(r["method"], r["scheme"], str(r["error"]))] += 1
    if fails:
        L += ["## Rows without a time", "", "| method | scheme | reason | rows |", "|---|---|---|---|"]
        for (m, s, e), n in sorted(fails.items()):
            L.append(f"| {m} | {s} | {e.replace('|', '/')[:300]} | {n} |")
        L.append("")
    if meta.get("peer_setup_s"):
        L += ["Build + first-call (compile / autotune / warm-up) seconds per method: " + ", ".join(f"{k} {v:.0f}" for k, v in meta["peer_setup_s"].items()),
              ""]
    for p in plots:
        L.append(f"![{p}]({p})")
    text = "\n".join(L) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


def write_plots(out_dir: str, records: list[dict]) -> list[str]:
    """One PNG per kind; a panel per (scheme, shape), µs vs M on log axes, one line per method."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for kind in ("dense", "moe"):
        rows = [r for r in records if r["kind"] == kind]
        names = method_names(rows)
        panels = list(dict.fromkeys((r["scheme"], r["N"], r["K"]) for r in rows if r["scheme"] != "bf16"))
        if not panels:
            continue
        ncol = min(3, len(panels))
        nrow = -(-len(panels) // ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.8 * nrow), squeeze=False)
        for ax, (scheme, n, k) in zip(axes.flat, panels):
            same = [r for r in rows if r["N"] == n and r["K"] == k and r["us"] is not None
                    and (r["scheme"] == scheme or r["scheme"] == "bf16"
                         or (r["method"] == "torch_scaled_mm" and scheme in ACT_FP8_SCHEMES))]
            ms_of_panel = {r["M"] for r in rows if r["scheme"] == scheme and r["N"] == n and r["K"] == k}
            for method in dict.fromkeys(r["method"] for r in same):
                pts = sorted((r["M"], r["us"]) for r in same if r["method"] == method and r["M"] in ms_of_panel)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=COLORS.get(method),
                            lw=2.5 if method == OURS else 1.2, label=names.get(method, method))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            gemm = next((r.get("gemm") for r in rows if r["N"] == n and r["K"] == k and r.get("gemm")), "")
            ax.set_title(f"{scheme} {gemm} N={n} K={k}".replace("  ", " "), fontsize=9)
            ax.set_xlabel("M (tokens)")
            ax.set_ylabel("µs")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.tight_layout()
        name = f"{kind}.png"
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        written.append(name)
    return written
