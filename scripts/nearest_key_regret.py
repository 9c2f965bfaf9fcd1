"""How much speed the dispatcher's nearest-key rule gives away, measured on a device's table (no GPU needed).

Leave one out: hide each key of the table, let ``dispatch.table_entry`` pick the entry that would govern that call,
take that entry's candidates in order and run the first one that was also timed at the hidden key; the regret is
its time there over the hidden key's fastest.  A key nobody tuned runs exactly such a pick, so this is what an
untuned shape loses on average.  Session 23: 1.15x geometric mean over the H200's 161 keys, lower than a
shape-first rule's 1.19-1.21x (ANALYSIS.md).

    python3 scripts/nearest_key_regret.py [autotune_configs/h200.json] [--worst 10]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from humming_triton.calls import Call  # noqa: E402
from humming_triton.dispatch import _parse_key, table_entry  # noqa: E402
from humming_triton.formats.scheme import QuantScheme  # noqa: E402


def _call(key: str) -> Call:
    op, scheme, dims, bucket = _parse_key(key)
    experts, n, k = dims if len(dims) == 3 else (0, *dims)
    return Call(op, QuantScheme.parse(scheme), torch.bfloat16, bucket, n, k, experts)


def regrets(table: dict) -> list[tuple[float, str, str]]:
    """(regret, hidden key, the key whose candidates ran) for every key the rule finds a neighbour for."""
    out = []
    for key, entry in table.items():
        if not entry.get("candidates"):
            continue
        try:
            call = _call(key)
        except ValueError:  # a scheme this version cannot parse
            continue
        here = {json.dumps([c["backend"], c["config"]], sort_keys=True): c["us"] for c in entry["candidates"]}
        found = table_entry(call, {k: v for k, v in table.items() if k != key})
        if found is None:
            continue
        runs = (here.get(json.dumps([c["backend"], c["config"]], sort_keys=True)) for c in found[1]["candidates"])
        t = next((t for t in runs if t is not None), None)
        if t is not None:
            out.append((t / entry["candidates"][0]["us"], key, found[0]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", nargs="?", default="autotune_configs/h200.json")
    ap.add_argument("--worst", type=int, default=10, help="list this many of the worst picks")
    a = ap.parse_args(argv)
    r = regrets(json.loads(Path(a.table).read_text())["dispatch"])
    if not r:
        print("no key has a neighbour with a common candidate")
        return 1
    g = math.exp(statistics.mean(math.log(x) for x, _, _ in r))
    print(f"{len(r)} keys: geometric mean regret {g:.3f}, {sum(x > 1.2 for x, _, _ in r)} over 1.2x, "
          f"max {max(x for x, _, _ in r):.2f}x")
    for x, key, near in sorted(r, reverse=True)[:a.worst]:
        print(f"  {x:5.2f}x  {key}  <- {near}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
