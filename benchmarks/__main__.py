"""``python3 -m benchmarks [--suite headline|decode|act|full] [--out DIR] [--interpret] [--only dense|moe] [--methods ...] [--compare OLD.json]``

TRITON_INTERPRET must be in the environment before triton is first imported, so ``--interpret`` is looked for
in argv before anything else is imported.
"""
from __future__ import annotations

import os
import sys

if "--interpret" in sys.argv[1:]:
    os.environ["TRITON_INTERPRET"] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("humming_triton", "cublas", "torch_scaled_mm", "torch_grouped_mm", "humming", "gemlite")
# opt-in (named with --methods only): ours in batch-invariant mode, for the mode's cost beside the default rows
OPTIONAL_METHODS = ("humming_triton_invariant",)
# seconds of layer building + first (compiling/autotuning) calls each peer may spend in the headline suite
HEADLINE_PEER_BUDGET_S = {"humming": 130.0, "gemlite": 60.0}


def _parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=("headline", "decode", "act", "moe", "full"), default="headline")
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results/<device-slug>/)")
    p.add_argument("--interpret", action="store_true",
                   help="CPU smoke mode: TRITON_INTERPRET=1, tiny dense cases, ours + torch CPU matmul only")
    p.add_argument("--only", choices=("dense", "moe"), default=None)
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help=f"subset of {', '.join(METHODS)} (comma- or space-separated); opt-in: "
                        f"{', '.join(OPTIONAL_METHODS)}")
    p.add_argument("--schemes", nargs="+", default=None, help="only these presets (e.g. w4a16 mxfp4)")
    p.add_argument("--peer-budget-s", type=float, default=None,
                   help="compile/warm-up seconds per peer (humming, gemlite); <= 0: unlimited. "
                        f"default: headline {HEADLINE_PEER_BUDGET_S}, full unlimited")
    p.add_argument("--no-cold-start", action="store_true", help="skip the fresh-process cold-start timing")
    p.add_argument("--our-backend", choices=("auto", "triton", "reference"), default=None,
                   help="debug: backend for our method (default auto on CUDA, triton with --interpret); "
                        "'reference' is only allowed with --interpret (never timed on a GPU)")
    p.add_argument("--strict", action="store_true", help="exit 1 if any of our rows failed its correctness check "
                   "(with --compare: or got more than 5 %% slower than in OLD.json)")
    p.add_argument("--compare", default=None, metavar="OLD.json",
                   help="after the run, compare our rows with a committed results.json (benchmarks/compare.py)")
    a = p.parse_args(argv)
    if a.methods:
        a.methods = [m for item in a.methods for m in item.split(",") if m]
        bad = sorted(set(a.methods) - set(METHODS) - set(OPTIONAL_METHODS))
        if bad:
            p.error(f"unknown method(s) {bad}; choose from {', '.join(METHODS + OPTIONAL_METHODS)}")
    if a.schemes:
        a.schemes = [s for item in a.schemes for s in item.split(",") if s]
    return a


def _git_commit() -> str:
    """HEAD of the checkout; a copy without .git (e.g. a device run) can pass it in HT_GIT_COMMIT."""
    if os.environ.get("HT_GIT_COMMIT"):
        return os.environ["HT_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


def _slug(name: str) -> str:
    s = re.sub(r"^nvidia[ _-]*", "", name.strip().lower())
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "device"


def _dispatch_table() -> tuple[dict, str]:
    """The "dispatch" section of autotune_configs/<device>.json (the tuner's measured candidates), named by
    the library's own device slug so the report reads the file the dispatcher reads; ({}, "") if none."""
    import json

    import torch
    try:
        import humming_triton.dispatch as ht_dispatch
        from humming_triton.capability import device_facts
        path = str(ht_dispatch.table_path(device_facts(torch.device("cuda")).slug))
    except Exception:  # noqa: BLE001 -- the report goes on without the section
        return {}, ""
    try:
        with open(path) as f:
            table = json.load(f).get("dispatch") or {}
    except (OSError, ValueError, AttributeError):
        return {}, ""
    return (table, os.path.relpath(path, REPO)) if isinstance(table, dict) else ({}, "")


def main(argv=None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    old_doc = None
    if a.compare:
        from .compare import load
        old_doc = load(a.compare)  # before the run: a wrong path should not cost a whole run
    import torch
    import triton

    if a.interpret:
        device, device_name = "cpu", "cpu (TRITON_INTERPRET=1)"
        our_backend = a.our_backend or "triton"
        slug = "cpu-interpret"
    else:
        if not torch.cuda.is_available():
            print("python3 -m benchmarks needs a CUDA GPU (torch.cuda.is_available() is False here).\n"
                  "On a CPU-only machine run the smoke mode instead: python3 -m benchmarks --interpret",
                  file=sys.stderr)
            return 2
        if a.our_backend == "reference":
            print("--our-backend reference is a CPU debug flag: the torch reference is not benchmarked on a GPU",
                  file=sys.stderr)
            return 2
        device, device_name = "cuda", torch.cuda.get_device_name()
        our_backend = a.our_backend or "auto"
        slug = _slug(device_name)
    out = a.out or os.path.join(REPO, "benchmarks", "results", slug)
    os.makedirs(out, exist_ok=True)

    from . import peers, report
    from .cases import suite_cases
    from .runner import cases_filter, run_cases
    from .timing import measure_ceilings

    t_start = time.perf_counter()
    suite = "interpret" if a.interpret else a.suite
    cases = cases_filter(suite_cases(suite), a.only, a.schemes)
    selected = set(a.methods or METHODS)
    if a.interpret:
        selected &= {"humming_triton", "humming_triton_invariant", "cublas"}  # no peers on CPU; "cublas": torch CPU matmul
    if a.peer_budget_s is not None:
        limits = {k: (a.peer_budget_s if a.peer_budget_s > 0 else None) for k in HEADLINE_PEER_BUDGET_S}
    else:
        limits = dict(HEADLINE_PEER_BUDGET_S) if suite in ("headline", "decode", "act", "moe") else {}
    budget = peers.PeerBudget(limits)

    print(f"humming_triton benchmarks: suite={suite} device={device_name} cases={len(cases)} "
          f"methods={sorted(selected)} out={out}", flush=True)
    ceilings = {}
    if device == "cuda":
        ceilings = measure_ceilings()
        print("ceilings:", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in ceilings.items()}, flush=True)

    records = run_cases(cases, suite=suite, selected=selected, device=device, our_backend=our_backend,
                        budget=budget, ceilings=ceilings, log=lambda s: print(s, flush=True))
    report.add_peer_ratios(records)
    floor_meta = {"skipped": "interpret mode (no GPU): not measured"}
    if device == "cuda":
        from .floor import StreamFloor, add_floor
        print("stream floor (bare Triton kernel reading the packed weight words) ...", flush=True)
        stream = StreamFloor()
        add_floor(records, stream, log=lambda s: print(s, flush=True))
        floor_meta = stream.summary()

    if a.interpret:
        cold = {"skipped": "interpret mode (no GPU)"}
    elif a.no_cold_start or "humming_triton" not in selected:
        cold = {"skipped": "--no-cold-start" if a.no_cold_start else "our method not selected"}
    else:
        from .coldstart import measure_cold_start
        print("cold start (fresh process, empty Triton cache, then warm) ...", flush=True)
        cold = measure_cold_start()
        print("cold start:", cold, flush=True)

    meta = {
        "device": device_name, "device_slug": slug, "suite": suite, "torch": torch.__version__,
        "triton": triton.__version__, "python": sys.version.split()[0], "git_commit": _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "interpret": a.interpret, "our_backend": our_backend, "ceilings": ceilings, "cold_start": cold,
        "peer_budget_s": limits, "peer_setup_s": {k: round(v, 1) for k, v in budget.spent.items()},
        "floor": floor_meta, "wall_s": round(time.perf_counter() - t_start, 1),
    }
    dispatch, dispatch_source = _dispatch_table() if device == "cuda" else ({}, "")
    if dispatch:
        meta["dispatch_table"] = {"source": dispatch_source, "entries": len(dispatch)}
    if old_doc is not None:
        from .compare import compare, format_text
        meta["compare"] = compare(old_doc, dict(meta, records=records))
        meta["compare"]["old_file"] = a.compare
    plots = report.write_plots(out, records)
    report.write_json(os.path.join(out, "results.json"), meta, records)
    text = report.write_markdown(os.path.join(out, "results.md"), meta, records, plots, dispatch, dispatch_source)
    print("\n" + text, flush=True)
    if old_doc is not None:
        print(format_text(meta["compare"]), flush=True)
    print(f"wrote {', '.join(['results.json', 'results.md'] + plots)} to {out} in {meta['wall_s']:.0f} s", flush=True)

    ours_bad = [r for r in records if r["method"] == "humming_triton" and isinstance(r["error"], str)
                and r["error"].startswith("wrong output")]
    if a.strict and ours_bad:
        print(f"--strict: {len(ours_bad)} of our rows failed the correctness check", file=sys.stderr)
        return 1
    if a.strict and old_doc is not None and meta["compare"]["regressions"]:
        print(f"--strict: {meta['compare']['regressions']} of our rows regressed vs {a.compare}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
