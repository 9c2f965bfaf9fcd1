#!/usr/bin/env bash
# One H200 session's worth of checks, all results under $OUT (at most 8 files come back):
#   GPU tests (failures logged as they happen), the demo, decode tokens/s vs bf16, the headline benchmark.
# Usage on the device: HT_GIT_COMMIT=<sha> bash scripts/gpu_session.sh   (peers from .whl when present)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/humming*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/humming*.whl .whl/gemlite*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 HT_FAILLOG=$OUT/gpu_failures.txt
touch "$HT_FAILLOG"
timeout 200 python3 -m pytest -m gpu -q -n 16 -p no:cacheprovider tests/ 2>&1 | grep -vi warn | tail -5 > "$OUT/gpu_tests.txt"
timeout 90 python3 -m humming_triton.demo > "$OUT/demo.txt" 2>&1
timeout 120 python3 -m benchmarks.e2e --compile --out "$OUT/e2e.json" > /dev/null 2>&1
timeout 240 python3 -m benchmarks --suite headline --out "$OUT/h200" --no-cold-start --peer-budget-s 60 > /dev/null 2>&1
tail -3 "$OUT/gpu_tests.txt"; grep -c FAILED "$HT_FAILLOG"
