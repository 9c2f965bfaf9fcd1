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
    """Harness plumbing, independent of the Triton kernels: ours through the debug reference backend."""
    p = _run(["--interpret", "--our-backend", "reference", "--out", str(tmp_path)], tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = _check_outputs(tmp_path)
    recs = _validate(doc)
    assert doc["cold_start"].get("skipped")
    ours = [r for r in recs if r["method"] == "humming_triton"]
    assert ours and all(r["us"] is not None for r in ours), ours
    assert any(r["method"] == "cublas" and r["us"] is not None for r in recs)
    assert all(r["vs_best_peer"] is not None for r in ours)


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
