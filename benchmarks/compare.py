"""Regression guard: our rows of two results.json files side by side.

``python3 -m benchmarks.compare OLD.json NEW.json [--threshold 0.05] [--strict]`` (no GPU needed), or
``python3 -m benchmarks --compare OLD.json`` after a run (the comparison then also goes into results.md and
into results.json under ``compare``).

Rows of our method (``humming_triton``) are matched by (kind, scheme, shape, M); the ratio is new µs / old µs,
so > 1 is slower.  A row is flagged when it got more than ``threshold`` slower, and also when it had a time
before and has none now (it failed its check or stopped running: a regression a ratio cannot show).  Rows
present in only one file are listed, not flagged: suites change.  ``--strict`` exits 1 when any row is flagged.
"""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["row_key", "compare", "format_text", "format_markdown", "main"]

OURS = "humming_triton"
THRESHOLD = 0.05


def row_key(r: dict) -> tuple:
    """(kind, scheme, shape, M); the MoE shape names the GEMM and the routing (E, top-k) as well."""
    if r["kind"] == "moe":
        shape = f"{r.get('gemm') or 'moe'} E{r.get('E')} top{r.get('topk')} {r['N']}x{r['K']}"
    else:
        shape = f"{r['N']}x{r['K']}"
    return (r["kind"], r["scheme"], shape, r["M"])


def _ours(doc: dict) -> dict:
    out = {}
    for r in doc.get("records", []):
        if r.get("method") == OURS:
            out.setdefault(row_key(r), r)  # first occurrence wins: a suite lists each case once
    return out


def compare(old: dict, new: dict, threshold: float = THRESHOLD) -> dict:
    """Both arguments are results.json documents; returns a JSON-ready summary (what ``--compare`` stores)."""
    a, b = _ours(old), _ours(new)
    rows = []
    for key in [k for k in b if k in a]:
        ou, nu = a[key]["us"], b[key]["us"]
        ratio = nu / ou if ou and nu else None
        if ratio is not None:
            status = "slower" if ratio > 1 + threshold else ("faster" if ratio < 1 - threshold else "same")
        elif ou and not nu:
            status = "lost"   # timed before, not now: the new row's error says why
        else:
            status = "untimed" if not ou and not nu else "new time"
        rows.append({"kind": key[0], "scheme": key[1], "shape": key[2], "M": key[3], "old_us": ou, "new_us": nu,
                     "ratio": ratio, "status": status,
                     "new_error": b[key]["error"] if status == "lost" else None})
    flagged = [r for r in rows if r["status"] in ("slower", "lost")]
    return {
        "old_commit": old.get("git_commit"), "new_commit": new.get("git_commit"),
        "old_date": old.get("date"), "old_device": old.get("device"), "new_device": new.get("device"),
        "threshold": threshold, "rows": rows, "regressions": len(flagged),
        "only_old": [list(k) for k in a if k not in b], "only_new": [list(k) for k in b if k not in a],
    }


def _f(v) -> str:
    return "—" if v is None else f"{v:.1f}"


def _ratio(v) -> str:
    return "" if v is None else f"{v:.3f}"


def _flag(r: dict) -> str:
    return {"slower": "SLOWER", "lost": "NO TIME NOW"}.get(r["status"], "")


def _header(c: dict) -> str:
    s = f"ours vs {c['old_commit']}"
    if c.get("old_device") and c.get("old_device") != c.get("new_device"):
        s += f" (other device: {c['old_device']} vs {c['new_device']})"
    return s


def format_text(c: dict) -> str:
    lines = [f"{_header(c)}: {len(c['rows'])} matched rows, {c['regressions']} flagged "
             f"(> {100 * c['threshold']:.0f} % slower, or lost their time)"]
    lines.append(f"{'kind':5s} {'scheme':12s} {'shape':28s} {'M':>5s} {'old us':>9s} {'new us':>9s} {'new/old':>8s}")
    for r in c["rows"]:
        lines.append(f"{r['kind']:5s} {r['scheme']:12s} {r['shape']:28s} {r['M']:5d} {_f(r['old_us']):>9s} "
                     f"{_f(r['new_us']):>9s} {_ratio(r['ratio']):>8s}  {_flag(r)}")
    for name, keys in (("only in old", c["only_old"]), ("only in new", c["only_new"])):
        if keys:
            lines.append(f"{name} ({len(keys)}): " + "; ".join(f"{k[0]} {k[1]} {k[2]} M={k[3]}" for k in keys))
    return "\n".join(lines)


def format_markdown(c: dict) -> list[str]:
    L = [f"## vs {c['old_commit']}", "",
         f"Our rows matched by (kind, scheme, shape, M) against results of commit {c['old_commit']}"
         f" ({c.get('old_date') or 'date unknown'}); new/old > {1 + c['threshold']:.2f} is flagged, as is a row "
         f"that had a time and has none now. **{c['regressions']} flagged** of {len(c['rows'])}.", ""]
    if c.get("old_device") and c.get("old_device") != c.get("new_device"):
        L += [f"Note: the old file was measured on {c['old_device']}, this run on {c['new_device']}.", ""]
    L += ["| kind | scheme | shape | M | old µs | new µs | new/old | |", "|---|---|---|---|---|---|---|---|"]
    for r in c["rows"]:
        flag = _flag(r)
        L.append(f"| {r['kind']} | {r['scheme']} | {r['shape']} | {r['M']} | {_f(r['old_us'])} | {_f(r['new_us'])} | "
                 f"{_ratio(r['ratio'])} | {'**' + flag + '**' if flag else ''} |")
    L.append("")
    for name, keys in (("Only in the old file", c["only_old"]), ("Only in this run", c["only_new"])):
        if keys:
            L += [f"{name}: " + ", ".join(f"{k[0]} {k[1]} {k[2]} M={k[3]}" for k in keys) + ".", ""]
    return L


def load(path: str) -> dict:
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or "records" not in doc:
        raise SystemExit(f"{path}: not a benchmarks results.json (no 'records')")
    return doc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--threshold", type=float, default=THRESHOLD, help="flag rows slower by more than this "
                   f"fraction (default {THRESHOLD})")
    p.add_argument("--strict", action="store_true", help="exit 1 if any row is flagged")
    p.add_argument("--markdown", action="store_true", help="print the markdown section instead of the text table")
    a = p.parse_args(argv)
    c = compare(load(a.old), load(a.new), a.threshold)
    print("\n".join(format_markdown(c)) if a.markdown else format_text(c))
    return 1 if a.strict and c["regressions"] else 0


if __name__ == "__main__":
    sys.exit(main())
