"""Which switches (humming_triton/switches.py) a device should turn on, from a same-run ``benchmarks.e2e`` A/B.

    python3 -m benchmarks.switch_verdicts e2e_llama.json e2e_moe.json --commit <sha> [--write autotune_configs/h200.json]

Each switch is judged on every comparison the runs hold (per model and scheme: the variant with the switch on
against the baseline with every switch off, both times from the same interleaved rounds).  On only when the
geometric mean of its speedups reaches ``--min-gain`` and no single comparison is slower than ``--max-loss``
allows; ``compile_triton`` must also beat ``compile_native`` where both ran (QuantLinear takes it first).  A
switch with no comparison in the runs gets no verdict (its table entry, if any, is kept).  Each verdict records
``max_tokens``: the largest batch up to which it passes (runs at several ``--batch`` sizes judge each prefix of
batch sizes; the first that fails ends the scope), and the path is on only up to that many tokens per call
(humming_triton/switches.py).  ``--write`` replaces the
table's ``switches`` entries it has a verdict for, each with its numbers and the commit as evidence.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

# switch -> [(variant key, baseline key)] in an e2e record (benchmarks/e2e.py's keys, times in seconds)
COMPARISONS = {
    "native_op": [("compile_native_s", "compile_s"), ("eager_native_s", "eager_s")],
    "moe_pipeline": [("eager_pipeline_s", "eager_s"), ("graph_pipeline_s", "graph_s")],
    "compile_triton": [("compile_triton_s", "compile_s"), ("compile_triton_s", "compile_native_s")],
}


def verdicts(results: list[dict], min_gain: float = 1.03, max_loss: float = 0.99) -> dict:
    """switch -> {"on", "gain": geometric-mean speedup, "worst": smallest speedup, "rows": [...], "max_tokens"}."""
    out = {}
    for switch, pairs in COMPARISONS.items():
        rows, batches = [], []
        for result in results:
            for rec in result.get("records", []):
                for variant, base in pairs:
                    if rec.get(variant) and rec.get(base):
                        rows.append((f"{rec['model']} {rec['scheme']} batch {rec.get('batch', 1)} {variant[:-2]} "
                                     f"vs {base[:-2]}", rec[base], rec[variant]))
                        batches.append(int(rec.get("batch", 1)))
        if not rows:
            continue
        # on up to the largest batch whose comparisons, with every smaller batch's, pass (decode steps: tokens per
        # call = batch); the gain and worst reported are those of that scope, or of every row where it is off
        scope = None
        for top in sorted(set(batches)):
            if _passes([r for r, b in zip(rows, batches) if b <= top], min_gain, max_loss):
                scope = top
            else:
                break
        kept = [r for r, b in zip(rows, batches) if scope is None or b <= scope]
        speedups = [b / v for _, b, v in kept]
        out[switch] = {"on": scope is not None, "gain": _geomean(speedups), "worst": min(speedups), "rows": rows,
                       "max_tokens": scope or 0}
    return out


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def _passes(rows: list, min_gain: float, max_loss: float) -> bool:
    speedups = [b / v for _, b, v in rows]
    return _geomean(speedups) >= min_gain and min(speedups) >= max_loss


def evidence(verdict: dict, device: str, commit: str, source: str) -> str:
    rows = "; ".join(f"{name} {b * 1e3:.3f} -> {v * 1e3:.3f} ms" for name, b, v in verdict["rows"])
    return (f"same-run A/B against every switch off ({device}, commit {commit}, {source}): {rows}; geometric-mean "
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
    if not found:
        print("no switch was timed against the baseline in these runs (benchmarks.e2e --compile-native, "
              "--eager-native, --moe-pipeline, --compile-triton)")
    for switch, v in found.items():
        print(f"{switch:15s} {'ON ' if v['on'] else 'off'}  up to {v['max_tokens']} tokens  gain {v['gain']:.3f}x  "
              f"worst {v['worst']:.3f}x")
        for name, b, t in v["rows"]:
            print(f"    {name:55s} {b * 1e3:8.3f} -> {t * 1e3:8.3f} ms  ({b / t:.3f}x)")
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
                               "evidence": evidence(v, device, args.commit, source)}
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {len(found)} switch verdict(s) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
