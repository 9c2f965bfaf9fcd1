#!/usr/bin/env bash
# One-time set-up, idempotent: installs what humming_triton needs without replacing an installed torch/triton
# (so a GPU machine keeps its CUDA build).  On a fresh CPU machine: torch 2.13.0 (the local CPU build) and
# triton 3.8.0 (whose interpreter runs our kernels on CPU).
#
# `bash scripts/bootstrap.sh --check-install` only checks that humming_triton imports from outside the repo, from
# this checkout (exit 0) or says why not (exit 1); it installs nothing.
set -euo pipefail
# the interpreter's own path, taken where the caller stands: the install check runs from / , where a relative
# PYTHON=.venv/bin/python (or a pyenv shim reading a .python-version) would name another Python
PY=$("${PYTHON:-python3}" -c "import sys; print(sys.executable)")
cd "$(dirname "$0")/.."
REPO=$(pwd -P)
pipi() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
# Prints why humming_triton is not installed for $PY (exit 1), or nothing (exit 0).  Run from / without
# PYTHONPATH: from the repo root Python finds ./humming_triton through the current folder, so a plain
# `python3 -c "import humming_triton"` there passed although the package was never installed (issue 18).
install_problem() {
  (cd / && env -u PYTHONPATH "$PY" - "$REPO" <<'PYEOF'
import os
import sys
try:
    import humming_triton
except ImportError as e:
    sys.exit(f"humming_triton is not importable outside the repo ({e})")
where = os.path.realpath(os.path.dirname(os.path.dirname(getattr(humming_triton, "__file__", None) or ".")))
if where != os.path.realpath(sys.argv[1]):
    sys.exit(f"humming_triton imports from {where}, not from this checkout ({sys.argv[1]})")
PYEOF
  ) 2>&1
}
if [ "${1:-}" = "--check-install" ]; then
  install_problem && echo "humming_triton is installed for $PY from $REPO"
  exit
fi
"$PY" -c "import torch" 2>/dev/null || pipi "torch==2.13.0"
"$PY" -c "import triton" 2>/dev/null || pipi "triton==3.8.0"
missing=$("$PY" - <<'PYEOF'
import importlib.metadata as md
import importlib.util as u
# pytest-xdist: the README's `pytest -n 16` GPU command (the CPU command stays one process, see README)
need = {"numpy": "numpy", "pytest": "pytest>=8", "hypothesis": "hypothesis>=6", "transformers": "transformers>=4.56",
        "safetensors": "safetensors>=0.4", "tqdm": "tqdm", "matplotlib": "matplotlib", "xdist": "pytest-xdist>=3"}
out = [v for k, v in need.items() if u.find_spec(k) is None]
# the editable install below builds without isolation, with this setuptools: before 70.1 it needs the `wheel`
# package for that (a Python 3.11 venv ships setuptools 65 without it)
try:
    old = tuple(int(p) for p in md.version("setuptools").split(".")[:2]) < (70, 1)
except (md.PackageNotFoundError, ValueError):
    old = True
print(" ".join(out + (["setuptools>=70.1"] if old else [])))
PYEOF
)
[ -z "$missing" ] || pipi $missing
# the CUTLASS / CuTe headers for the compile check of cutlass_ext's sm_100a GEMMs: best effort (an index without
# the package must not stop the rest; tests/test_cutlass_sm100.py then says it could not run)
"$PY" -c "import cutlass_library" 2>/dev/null || pipi "nvidia-cutlass==4.2.0.0" \
  || echo "bootstrap: nvidia-cutlass could not be installed; the sm_100a compile check will be skipped" >&2
# the package itself, editable, without letting pip touch torch/triton; then checked again from outside the repo
if ! why=$(install_problem); then
  echo "bootstrap: $why: pip install -e ."
  pipi --no-deps --no-build-isolation -e .
  if ! why=$(install_problem); then
    echo "bootstrap: after pip install -e . still: $why" >&2
    exit 1
  fi
fi
# Optional, off by default (HT_BOOTSTRAP_TRITON_ALT=1): a second Triton -- 3.6.0, the H200's -- alone in
# .venv-triton36 (no torch: compile_check's compile step needs only triton), so that
# tests/test_compile_matrix.py also compiles every kernel variant with it.  Cost measured on the CPU machine:
# ~10 s with pip's cache warm, 667 MB of disk; the test then takes ~4-7 more minutes on 2 cores.
if [ "${HT_BOOTSTRAP_TRITON_ALT:-0}" = 1 ]; then
  if ! .venv-triton36/bin/python -c "import triton" 2>/dev/null; then
    "$PY" -m venv .venv-triton36
    .venv-triton36/bin/python -m pip install -q --disable-pip-version-check "triton==3.6.0"
  fi
fi
