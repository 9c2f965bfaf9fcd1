"""Which switches (humming_triton/switches.py) a device should turn on, from a same-run ``benchmarks.e2e`` A/B.

    python3 -m benchmarks.switch_verdicts e2e_llama.json e2e_moe.json --commit <sha> [--write autotune_configs/h200.json]

Each switch is judged on every comparison the runs hold (per model, scheme and batch: the variant with the switch
on against the baseline with every switch off, both times from the same interleaved rounds).  A comparison fails
outright when the variant raised (``*_error``) or its output left eager's by more than ``MAX_DIFF`` (a wrong
kernel is O(1); inductor's fusion is ~1e-2).  A switch is on when the geometric mean of its speedups reaches
``--min-gain`` and no comparison is slower than ``--max-loss`` allows; ``compile_triton`` must also beat
``compile_native`` where both ran (QuantLinear takes it first).  Its scope:
- ``max_tokens``: batches are judged as growing prefixes (batch 1, then 1 and 8, ...); the scope ends before the
  first batch whose comparisons fail, or that lacks a model the smallest batch had (decode: tokens per call =
  batch; batches between two timed ones are taken as timed);
- ``schemes``: the schemes compared within that scope; any other scheme keeps the path off.
A switch with no comparison in the runs gets no verdict (its table entry, if any, is kept).  ``--write`` replaces
the table's entries it has a verdict for, each with its numbers and the commit as evidence.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

MAX_DIFF = 3e-2
# switch -> [(variant time, baseline time, the variant's output difference from eager, the variant's error)]
# in an e2e record (benchmarks/e2e.py's keys, times in seconds)
COMPARISONS = {
    "native_op": [("compile_native_s", "compile_s", "compile_native_rel_diff_vs_eager", "compile_native_error"),
                  ("eager_native_s", "eager_s", "native_rel_diff_vs_eager", "native_error")],
    "moe_pipeline": [("eager_pipeline_s", "eager_s", "pipeline_rel_diff_vs_eager", "pipeline_error"),
                     ("graph_pipeline_s", "graph_s", "pipeline_rel_diff_vs_eager", "pipeline_error")],
    "compile_triton": [("compile_triton_s", "compile_s", "compile_triton_rel_diff_vs_eager", "compile_triton_error"),
                       ("compile_triton_s", "compile_native_s", "compile_triton_rel_diff_vs_eager",
                        "compile_triton_error")],
}


# benchmarks.e2e --table-defaults: the device's defaults as a whole (reported, not judged)
DEFAULTS = [("eager_table_s", "eager_s", "table_rel_diff_vs_eager", "table_error"),
            ("graph_table_s", "graph_s", "table_rel_diff_vs_eager", "table_error"),
            ("compile_table_s", "compile_s", "compile_table_rel_diff_vs_eager", "compile_table_error")]


def _comparisons(results: list[dict], pairs: list) -> list[dict]:
    """One row per (model, scheme, batch, comparison) found; a repeated record counts once (the first)."""
    rows, seen = [], set()
    for result in results:
        for rec in result.get("records", []):
            batch = int(rec.get("batch", 1))
            for variant, base, diff, error in pairs:
                key = (rec.get("model"), rec.get("scheme"), batch, variant, base)
                if key in seen or not rec.get(base) or not (rec.get(variant) or rec.get(error)):
                    continue
                seen.add(key)
                ok = not rec.get(error) and rec.get(variant) and rec.get(diff, 0.0) <= MAX_DIFF
                rows.append({"model": rec["model"], "scheme": rec["scheme"], "batch": batch,
                             "what": f"{rec['model']} {rec['scheme']} batch {batch} {variant[:-2]} vs {base[:-2]}",
                             "base": rec[base], "variant": rec.get(variant) or float("inf"),
                             "speedup": rec[base] / rec[variant] if ok else 0.0})
    return rows


def verdicts(results: list[dict], min_gain: float = 1.03, max_loss: float = 0.99) -> dict:
    """switch -> {"on", "max_tokens", "schemes", "gain" and "worst" (speedups within the scope, or of every row
    where it is off), "rows"}."""
    out = {}
    for switch, pairs in COMPARISONS.items():
        rows = _comparisons(results, pairs)
        if not rows:
            continue
        batches = sorted({r["batch"] for r in rows})
        models = {r["model"] for r in rows if r["batch"] == batches[0]}
        scope = 0
        for top in batches:
            inside = [r for r in rows if r["batch"] <= top]
            if not models <= {r["model"] for r in rows if r["batch"] == top} or not _passes(inside, min_gain, max_loss):
                break
            scope = top
        kept = [r for r in rows if r["batch"] <= scope] or rows
        speedups = [r["speedup"] for r in kept]
        out[switch] = {"on": scope > 0, "max_tokens": scope, "gain": _geomean(speedups), "worst": min(speedups),
                       "schemes": sorted({r["scheme"] for r in kept}) if scope else [], "rows": rows}
    return out


def _geomean(xs: list[float]) -> float:
    return 0.0 if min(xs) <= 0 else math.exp(sum(map(math.log, xs)) / len(xs))


def _passes(rows: list[dict], min_gain: float, max_loss: float) -> bool:
    speedups = [r["speedup"] for r in rows]
    return _geomean(speedups) >= min_gain and min(speedups) >= max_loss


def evidence(verdict: dict, device: str, commit: str, source: str) -> str:
    rows = "; ".join(f"{r['what']} {r['base'] * 1e3:.3f} -> {r['variant'] * 1e3:.3f} ms"
                     + ("" if r["speedup"] else " (failed: error or output off)") for r in verdict["rows"])
    return (f"same-run A/B against every switch off ({device}, commit {commit}, {source}): {rows}; within the scope "
            f"(up to {verdict['max_tokens']} tokens, {', '.join(verdict['schemes']) or 'none'}) geometric-mean "
            f"speedup {verdict['gain']:.3f}x, worst {verdict['worst']:.3f}x")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="benchmarks.e2e --out JSON files of one device")
    ap.add_argument("--commit", required=True, help="the commit the runs measured")
    ap.add_argument("--write", help="a device table (autotune_configs/<slug>.json) to update")
    ap.add_argument("--min-gain", type=float, default=1.03)
    ap.add_argument("--max-loss", type=float, default=0.99)
    args = ap.parse_args(argv)
    results = [json.loads(Path(p).read_text()) for p in args.results]
    devices = {r.get("device") for r in results}
    if len(devices) != 1:
        print(f"the runs name {len(devices)} devices ({sorted(map(str, devices))}): one device's runs only",
              file=sys.stderr)
        return 2
    device = devices.pop()
    found = verdicts(results, args.min_gain, args.max_loss)
    defaults = _comparisons(results, DEFAULTS)
    if defaults:  # benchmarks.e2e --table-defaults: the table's switches together, as the library runs them here
        print("this device's table as it stands (every switch as the table sets it) against every switch off:")
        for r in defaults:
            print(f"    {r['what']:62s} {r['base'] * 1e3:8.3f} -> {r['variant'] * 1e3:8.3f} ms  ({r['speedup']:.3f}x)")
    if not found:
        print("no switch was timed against the baseline in these runs (benchmarks.e2e --compile-native, "
              "--eager-native, --moe-pipeline, --compile-triton)")
    for switch, v in found.items():
        print(f"{switch:15s} {'ON ' if v['on'] else 'off'}  up to {v['max_tokens']} tokens  schemes "
              f"{','.join(v['schemes']) or '-'}  gain {v['gain']:.3f}x  worst {v['worst']:.3f}x")
        for r in v["rows"]:
            print(f"    {r['what']:62s} {r['base'] * 1e3:8.3f} -> {r['variant'] * 1e3:8.3f} ms  ({r['speedup']:.3f}x)")
    if args.write:
        path = Path(args.write)
        table = json.loads(path.read_text()) if path.exists() else {}
        if table.get("device") not in (None, device):
            print(f"{path} is {table['device']}'s table, the runs are {device}'s", file=sys.stderr)
            return 2
        table.setdefault("device", device)
        source = ", ".join(args.results)
        section = table.setdefault("switches", {})
        for switch, v in found.items():
            section[switch] = {"on": v["on"], "commit": args.commit, "max_tokens": v["max_tokens"],
                               "schemes": v["schemes"], "evidence": evidence(v, device, args.commit, source)}
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {len(found)} switch verdict(s) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
