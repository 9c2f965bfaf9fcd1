"""The benchmark harness's CPU smoke mode (``python3 -m benchmarks --interpret``) and its JSON schema.

Run as a subprocess: TRITON_INTERPRET must be set before triton is imported, which this pytest process may
already have done.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = {"humming_triton", "cublas", "torch_scaled_mm", "torch_grouped_mm", "humming", "gemlite"}


def _run(args, tmp_path, timeout=120):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _validate(doc: dict) -> list[dict]:
    for key in ("device", "torch", "triton", "git_commit", "date", "ceilings", "cold_start", "records"):
        assert key in doc, f"results.json lacks top-level {key!r}"
    recs = doc["records"]
    assert recs, "no records"
    for r in recs:
        for key in ("kind", "method", "scheme", "N", "K", "M", "us", "error", "tflops", "gbps", "pct_hbm",
                    "pct_tc", "vs_best_peer"):
            assert key in r, f"record lacks {key!r}: {r}"
        assert r["kind"] in ("dense", "moe")
        assert r["method"] in METHODS
        assert all(isinstance(r[k], int) and r[k] > 0 for k in ("N", "K", "M"))
        if r["kind"] == "moe":
            assert isinstance(r["E"], int) and isinstance(r["topk"], int)
        if r["us"] is None:
            assert isinstance(r["error"], str) and r["error"], f"failed row without a reason: {r}"
        else:
            assert r["us"] > 0 and math.isfinite(r["us"])
            assert isinstance(r["error"], float) and 0 <= r["error"] <= r["tol"], r
            assert r["tflops"] > 0 and r["gbps"] > 0
    return recs


def _check_outputs(out) -> dict:
    files = sorted(os.listdir(out))
    assert "results.json" in files and "results.md" in files, files
    assert len(files) <= 6, files
    with open(out / "results.json") as f:
        return json.load(f)


def test_interpret_smoke_with_reference_backend(tmp_path):
    """Harness plumbing, independent of the Triton kernels: ours through the debug reference backend; also
    ``--compare`` against a synthetic older file (one matching row, 1000x slower then; one row gone since)."""
    old = _doc("abc1234", [_rec("w4a16", 64, 256, 3, 1e9), _rec("w4a16", 64, 256, 99, 1.0)])
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.json").write_text(json.dumps(old))
    out = tmp_path / "out"
    p = _run(["--interpret", "--our-backend", "reference", "--out", str(out),
              "--compare", str(tmp_path / "old" / "results.json")], tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = _check_outputs(out)
    recs = _validate(doc)
    assert doc["cold_start"].get("skipped")
    ours = [r for r in recs if r["method"] == "humming_triton"]
    assert ours and all(r["us"] is not None for r in ours), ours
    assert any(r["method"] == "cublas" and r["us"] is not None for r in recs)
    assert all(r["vs_best_peer"] is not None for r in ours)
    # no GPU: the floor is not measured (not faked); the reference backend records no plan
    assert doc["floor"].get("skipped")
    assert all(r["floor_us"] is None and r["pct_floor"] is None for r in recs if r["kind"] == "dense")
    assert all("path" in r for r in recs)
    c = doc["compare"]
    assert c["old_commit"] == "abc1234" and c["regressions"] == 0
    assert [(r["shape"], r["M"], r["status"]) for r in c["rows"]] == [("64x256", 3, "faster")]
    assert ["dense", "w4a16", "64x256", 99] in c["only_old"]
    md = (out / "results.md").read_text()
    assert "## vs abc1234" in md and "floor µs" in md and "| path |" in md


@pytest.mark.interpret
@pytest.mark.skipif(importlib.util.find_spec("humming_triton.kernels.dense") is None,
                    reason="the Triton dense kernels have not landed yet")
def test_interpret_smoke_triton(tmp_path):
    """What CI runs: our Triton kernels under the interpreter on tiny dense cases, checked and timed."""
    p = _run(["--interpret", "--strict", "--out", str(tmp_path)], tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    recs = _validate(_check_outputs(tmp_path))
    ours = [r for r in recs if r["method"] == "humming_triton"]
    assert len(ours) >= 2
    for r in ours:
        assert r["us"] is not None, f"our {r['scheme']} row failed: {r['error']}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_refuses_without_cuda(tmp_path):
    p = _run(["--out", str(tmp_path)], tmp_path)
    assert p.returncode == 2
    assert "CUDA" in p.stderr and "--interpret" in p.stderr
    assert not os.listdir(tmp_path)


# --- the pieces, without a run -------------------------------------------------------------------------------

def _rec(scheme, n, k, m, us, method="humming_triton", **kw):
    r = {"kind": "dense", "method": method, "scheme": scheme, "N": n, "K": k, "M": m, "rows": m, "us": us,
         "error": 1e-3 if us else "wrong output: ...", "rel_err": 1e-3, "tflops": 1.0 if us else None,
         "gbps": 100.0 if us else None, "pct_hbm": 10.0 if us else None, "pct_tc": 1.0 if us else None,
         "vs_best_peer": None}
    r.update(kw)
    return r


def _doc(commit, records):
    return {"device": "NVIDIA H200", "suite": "decode", "torch": "2.11", "triton": "3.6", "git_commit": commit,
            "date": "2026-12-01", "ceilings": {}, "cold_start": {"skipped": "x"}, "records": records}


def test_compare_flags_regressions(tmp_path, capsys):
    from benchmarks import compare

    old = _doc("old1234", [_rec("w4a16", 8192, 8192, 1, 100.0), _rec("w4a16", 8192, 8192, 2, 100.0),
                           _rec("w4a16", 8192, 8192, 4, 100.0), _rec("w4a16", 8192, 8192, 8, 100.0),
                           _rec("mxfp4", 8192, 8192, 1, 50.0), _rec("bf16", 8192, 8192, 1, 10.0, "cublas")])
    new = _doc("new5678", [_rec("w4a16", 8192, 8192, 1, 110.0),   # 10 % slower: flagged
                           _rec("w4a16", 8192, 8192, 2, 103.0),   # 3 %: within noise
                           _rec("w4a16", 8192, 8192, 4, 80.0),    # faster
                           _rec("w4a16", 8192, 8192, 8, None),    # lost its time: flagged
                           _rec("nvfp4", 8192, 8192, 1, 60.0),    # new row
                           _rec("bf16", 8192, 8192, 1, 99.0, "cublas")])  # peers are not compared
    c = compare.compare(old, new)
    status = {(r["scheme"], r["M"]): r["status"] for r in c["rows"]}
    assert status == {("w4a16", 1): "slower", ("w4a16", 2): "same", ("w4a16", 4): "faster", ("w4a16", 8): "lost"}
    assert c["regressions"] == 2
    assert c["only_old"] == [["dense", "mxfp4", "8192x8192", 1]]
    assert c["only_new"] == [["dense", "nvfp4", "8192x8192", 1]]
    assert abs(next(r for r in c["rows"] if r["M"] == 1)["ratio"] - 1.1) < 1e-9
    text = compare.format_text(c)
    assert text.count("SLOWER") == 1 and "NO TIME NOW" in text and "only in old" in text
    md = "\n".join(compare.format_markdown(c))
    assert md.startswith("## vs old1234") and "**SLOWER**" in md and "Only in this run" in md

    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    assert compare.main([str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 0
    assert compare.main([str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--strict"]) == 1
    (tmp_path / "ok.json").write_text(json.dumps(_doc("x", [_rec("w4a16", 8192, 8192, 2, 103.0)])))
    assert compare.main([str(tmp_path / "old.json"), str(tmp_path / "ok.json"), "--strict"]) == 0
    capsys.readouterr()


def test_moe_suite_covers_both_expert_shapes():
    """The MoE issue's rows: Qwen3-30B-A3B (128 experts, top-8) and Mixtral-8x7B (8, top-2), both GEMMs, three
    schemes, 1..4096 tokens."""
    from benchmarks.cases import suite_cases
    got = {(c.scheme, c.E, c.topk, c.N, c.K, c.M) for c in suite_cases("moe")}
    for scheme in ("w4a16", "mxfp4", "w4a8-mxfp4"):
        for m in (1, 16, 64, 256, 1024, 4096):
            assert {(scheme, 128, 8, 1536, 2048, m), (scheme, 128, 8, 2048, 768, m),
                    (scheme, 8, 2, 28672, 4096, m), (scheme, 8, 2, 4096, 14336, m)} <= got
    assert len(got) == 72


def test_decode_suite_has_gate_up_shapes():
    from benchmarks.cases import suite_cases

    got = {(c.scheme, c.N, c.K, c.M) for c in suite_cases("decode")}
    for n, k in ((14336, 4096), (28672, 4096)):
        for m in (1, 2, 4, 8, 16):
            assert ("w4a16", n, k, m) in got


_META = {"device": "NVIDIA H200", "suite": "decode", "date": "2026-12-01", "torch": "2.11", "triton": "3.6",
         "git_commit": "abc", "ceilings": {}, "cold_start": {"skipped": "x"}}


def _dense_row(md: str) -> dict:
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    row = [c.strip() for c in lines[1].strip("|").split("|")]
    return dict(zip(head, row))


def test_report_floor_and_path_columns(tmp_path):
    from benchmarks import report

    with_ = [_rec("w4a16", 8192, 8192, 1, 32.0, floor_us=16.0, pct_floor=50.0, path="triton/swapab bn=128 sk=2")]
    without = [_rec("w4a16", 8192, 8192, 1, 32.0, floor_us=None, pct_floor=None, path=None)]
    legacy = [_rec("w4a16", 8192, 8192, 1, 32.0)]  # an older results.json: no such fields at all
    row = _dense_row(report.write_markdown(str(tmp_path / "a.md"), _META, with_, []))
    assert (row["floor µs"], row["% floor"], row["path"]) == ("16.0", "50", "triton/swapab bn=128 sk=2")
    for recs in (without, legacy):
        row = _dense_row(report.write_markdown(str(tmp_path / "b.md"), _META, recs, []))
        assert (row["floor µs"], row["% floor"], row["path"]) == ("", "", "")
        assert row["**ours µs**"] == "**32.0**"


def test_dispatch_section_renders():
    from benchmarks import report

    table = {
        "quant_linear|w4a16|8192x8192|m1": {
            "candidates": [{"backend": "triton", "family": "swapab", "config": {"block_n": 128, "block_k": 128,
                                                                                 "split_k": 2}, "us": 20.1},
                           {"backend": "torch", "family": "dequant_cublas", "config": {}, "us": 80.0},
                           {"backend": "triton", "family": "tiled", "config": {"block_n": 64}, "us": 95.0}],
            "failed": [{"backend": "triton", "family": "gemv", "config": {}, "error": "out of resources"}],
            "triton": "3.6.0", "torch": "2.11.0", "commit": "abc1234"},
        "grouped_linear|w4a16|128x1536x2048|m16": {"candidates": [], "failed": []},
    }
    md = "\n".join(report.dispatch_section(table, "autotune_configs/h200.json"))
    assert md.startswith("## Dispatch table") and "autotune_configs/h200.json" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| quant_linear\\|w4a16\\|8192x8192\\|m1 |"))
    assert "triton/swapab bn=128 bk=128 sk=2" in line and "20.1" in line
    assert "torch/dequant_cublas" in line and "80.0" in line and "| 3 | 1 |" in line
    assert "triton 3.6.0, torch 2.11.0, commit abc1234" in line
    assert "| grouped_linear\\|w4a16\\|128x1536x2048\\|m16 | — |" in md
    assert report.dispatch_section({}) == []
    full = report.write_markdown(os.devnull, _META, [_rec("w4a16", 8192, 8192, 1, 32.0)], [], table, "x.json")
    assert "## Dispatch table" in full


def test_our_backend_check_and_plan(monkeypatch):
    """torch-composed (dequantize + cuBLAS) runs are timed; only the float32 reference is rejected; the plan
    comes from dispatch.last_plan when it exists and is None while it does not."""
    import humming_triton as ht
    from benchmarks import methods as mt

    shape = mt.ShapeCtx((torch.randn(32, 128) * 0.02).to(torch.bfloat16), "cpu")
    prep = mt.make_ours(mt.SchemeCtx("w4a16", shape), shape.inputs(2), "auto")
    for got, ok in (("triton", True), ("torch", True), ("reference", False)):
        monkeypatch.setattr(ht, "last_backend", lambda op, got=got: got)
        assert (prep.check_backend() is None) == ok, got
    monkeypatch.delattr(mt.ht_dispatch, "last_plan", raising=False)
    assert prep.plan() is None
    monkeypatch.setattr(mt.ht_dispatch, "last_plan", lambda op: f"{op}: triton/gemv bn=8", raising=False)
    assert prep.plan() == "quant_linear: triton/gemv bn=8"


def test_floor_bytes_and_kernel():
    """The floor streams the packed code words of the row's format; its kernel XOR-reduces every word (checked
    under the interpreter -- the timing itself needs a GPU)."""
    from benchmarks import floor

    assert floor.weight_word_bytes("w4a16", 8192, 8192) == 8192 * 8192 // 2
    assert floor.weight_word_bytes("w8a16", 4096, 14336) == 4096 * 14336
    assert floor.weight_word_bytes("w3a16", 16, 64) == 16 * 6 * 4
    assert floor.weight_word_bytes("bf16", 16, 64) == 16 * 64 * 2
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("kernel check runs under the interpreter")
    n, block, tiles = 3000, 256, 4
    w = torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), dtype=torch.int32)
    grid = -(-n // (block * tiles))
    out = torch.empty(grid, dtype=torch.int32)
    floor._stream_words[(grid,)](w, out, n, BLOCK=block, TILES=tiles)
    for p in range(grid):
        chunk = w[p * block * tiles:(p + 1) * block * tiles]
        want = 0
        for v in chunk.tolist():
            want ^= v
        assert int(out[p]) == want


def test_report_reads_the_dispatchers_table():
    """The GPU report's "Dispatch table" section reads the file dispatch reads (posed as the H200: no CUDA)."""
    from benchmarks.__main__ import _dispatch_table
    from humming_triton import capability, dispatch
    with capability.pose_as((9, 0)):
        table, source = _dispatch_table()
    assert source == os.path.relpath(str(dispatch.table_path("h200")), REPO)
    assert table and all(entry["candidates"] for entry in table.values())


def test_tune_lists_the_keys_a_table_lacks(tmp_path, capsys):
    """``tune --missing --list`` names the suite keys without a measured entry, on a CPU (no GPU needed)."""
    from humming_triton import tune
    keys = [tune._key(c) for c in tune.suite_cases(["moe"])]
    assert len(keys) == len(set(keys)) and all(k.startswith("grouped_linear|") for k in keys)
    table = tmp_path / "dev.json"
    table.write_text(json.dumps({"dispatch": {k: {"candidates": []} for k in keys[1:]}}))
    assert tune.main(["--suite", "moe", "--missing", "--list", "--out", str(table)]) == 0
    assert capsys.readouterr().out.split() == [keys[0]]
    assert tune.main(["--suite", "moe", "--match", "w4a16", "--list", "--out", str(table)]) == 0
    listed = capsys.readouterr().out.split()
    assert listed and all("|w4a16|" in k for k in listed)
    if not torch.cuda.is_available():  # tuning itself still needs the GPU
        assert tune.main(["--suite", "moe", "--missing", "--out", str(table)]) == 2
