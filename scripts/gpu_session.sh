#!/usr/bin/env bash
# One H200 device call's worth of checks (a call may run 600 s), every result under $OUT (at most 8 files come back).
# Usage on the device:  HT_GIT_COMMIT=<sha> STEPS="models demo e2e" bash scripts/gpu_session.sh
# (<sha> written out here: the device copy's own git HEAD is not this checkout's, so $(git rev-parse) there is wrong)
# Steps (run in the order given; each has its own time limit so one hang cannot eat the call):
# (gpu_testlog.txt: one line per test as it finishes)
#   models  GPU tests of the grouped/fused-MoE kernels, the quantized-activation kernels and whole tiny models
#           (eager vs reference, CUDA-graph replay, torch.compile)                      -> gpu_tests.txt
#   presets the WnA16 preset GPU tests                                                    -> gpu_tests.txt
#   verify  word-major GEMV + launch replay + preset + grouped/MoE (incl. quantized activations, act-order) +
#           quantized-activation + op backward + tiny-model GPU tests
#   tune    the measured dispatch table: every candidate (backend x family x config) of every case of the
#           suites $TUNE_SUITES (default headline,decode; filter $TUNE_ONLY), compiled in $TUNE_JOBS processes first
#           (writes autotune_configs/<device>.json, copied to $OUT); TUNE_MISSING=1: only the keys the table lacks
#           (list them on the CPU first: python3 -m humming_triton.tune --suite ... --missing --list --slug h200)
#   tuneclean a second tune pass over $TUNE_MATCH_CLEAN, run only when no GPU test failed earlier in the call
#   native  the native CUDA library (cutlass_ext): loads or is built here, its GPU tests, an ncu profile and a
#           sweep of its configs at the decode shapes, weight-only and on activation codes (mma_decode_act)
#                                                                            -> native*.txt, native*_sweep.json
#   ab      the native sweep (mma_decode, M = $AB_M, default 1,16) run with other builds of the library first
#           ($AB_LIBS "name:path ...", default "old:$AB_LIB", e.g. the previous commit's kernels), then with this
#           checkout's -- a same-run A/B of a kernel change                    -> ab_<name>.txt/json, ab_new.txt/json
#   passgrid  the grouped decode kernel on the expert grid vs the pass grid, same run ($PG_SCHEMES)
#   abgrouped same-run A/B of the grouped decode kernel (grouped_probe --sweep) under $AB_LIBS, then this build
#           -> abg_<name>.txt/json, abg_new.txt/json
#   groupedprobe the grouped decode kernel at MoE mid-token rows: wide config sweep + ncu sections
#           -> grouped_sweep.txt/json, grouped_ncu.txt
#   ncu     ncu --set full of $NCU_LAUNCHES (native_probe --launches): sections and per-SASS stalls
#                                                                 -> decode.ncu-rep, ncu.txt, ncu_sass.csv
#   cutlass the sm_90a CUTLASS mixed-input GEMMs: load the carried build (else build here, 16 jobs), their GPU tests,
#           a sweep of every variant at the headline shapes (M = 16..4096) beside the table's auto, memcheck over
#           the tail shapes                                                           -> cutlass*.txt, cutlass_sweep.json
#   cutlassodd compute-sanitizer memcheck of $CUTLASS_MEMCHECK_FAMILIES (default cutlass_mixed_shuffled) on tails
#                                                                                   -> cutlass_sanitize.txt
#   syncfree every registered path (backend x family) and the MoE ops under set_sync_debug_mode("error") -> gpu_tests.txt
#   sanitize compute-sanitizer ($SANITIZE_TOOLS, default memcheck) over the native kernel's tail shapes     -> sanitize.txt
#   families compute-sanitizer memcheck over every registered path (scripts/sanitize_probe.py; FAMILIES_SHARDS=N
#           splits it over N parallel processes, each run once without the sanitizer first to fill Triton's cache),
#           racecheck over the split-K and grouped ones
#                                      -> families_unsanitized.txt, sanitize_families.txt, racecheck_families.txt
#   tp      2+ GPUs: scripts/tp_check.py (TP MLP pair + EP grouped GEMM vs one GPU, timed)      -> tp.json
#   blockwise which block-scaled fp8 recipes F.scaled_mm takes here, and their speed  -> blockwise_probe.txt/json
#   scaledmm where an fp8 GEMM's time goes: act quantizers, _scaled_mm row-wise vs tensor-wise  -> scaled_mm_probe.txt/json
#   actquant the activation quantizers alone: mx_rows fp32 vs float64, e4m3 per-token variants  -> act_quant_probe.txt/json
#   actncu  ncu sections of the per-token quantizer at 4096 x 8192 and 32768 x 2048 (scripts/act_quant_ncu.py)
#           -> act_quant_ncu.txt
#   moebreak MoE grouped GEMMs kernel by kernel (scripts/moe_breakdown.py) + ncu sections ($MOENCU_CASES)
#           -> moe_breakdown.txt/json, moe_ncu.txt
#   files   the GPU tests of the files in $GPU_TEST_FILES                                -> gpu_tests.txt
#           (pytest arguments may follow the files, e.g. "tests/test_cutlass_sm90.py -k shuffled": a carried
#           library built for some CUTLASS formats fails the other formats' cases, which skips tuneclean)
#   intdecode the integer-decode tile loops (INT_DECODE_ACT): GPU tests, same-run A/B  -> int_decode_probe.txt/json
#   new     GPU tests of this session's new paths (swap-AB family, torch-composed families, dispatch)
#   dense   every format x kernel family GPU test                                          -> gpu_tests.txt
#   matrix  every GPU test of tests/ ($MATRIX_S, default 420 s)                            -> gpu_tests.txt
#   nativeop the C++ host path of a planned decode call (cutlass_ext/native_op.py, opt-in): built against this
#           machine's torch, its GPU tests, and the opt-in MoE pipeline's     -> native_op.txt, gpu_tests.txt
#           (then e.g. E2E_COMPILE="--compile --compile-native" E2E_S=200 E2E_MOE_S=200 for e2e's same-run
#           A/B, dense Llama and Qwen3-MoE: the grouped expert GEMMs take the C++ path too);
#           E2E_MOE_EXTRA=--moe-pipeline adds the opt-in MoE pipeline's eager / graph A/B (kernels/moe.py)
#   overhead host-side µs per call of each path (eager, op, compiled) + profiles  -> overhead.txt
#   demo    python3 -m humming_triton.demo --backend triton                                -> demo.txt
#   e2e     decode tokens/s vs bf16: dense Llama ($E2E_SCHEMES) and Qwen3-MoE (eager, CUDA graph, torch.compile),
#           at each batch of $E2E_BATCHES (default 1);
#           E2E_GENERATE=1 adds HF generate with a static KV cache (eager and compiled)
#           and benchmarks.switch_verdicts over the runs                  -> e2e.txt, e2e_*.json, switch_verdicts.txt
#   bench   the headline benchmark with peers                                              -> bench/ (4 files)
#   decode  the decode-batch benchmark (M = 1..16) and the W4A4 rows, with peers               -> decode/
#   act     the activation-quantized suite (W8A8 / W4A8 at 8192², M = 1..4096), with peers         -> act/
#   moe     the MoE suite (Qwen3-30B-A3B and Mixtral-8x7B expert GEMMs, w4a16 / mxfp4 / w4a8-mxfp4, 1..4096
#           tokens), with peers                                                                     -> moe/
#   invariant ours vs ours in batch-invariant mode, headline dense rows of $INV_SCHEMES (default w4a16,w8a16,mxfp4)
#           -> invariant/ (the mode's cost, for the README)
# Failures of every pytest step are appended to gpu_failures.txt as they happen.
set -u
cd "$(dirname "$0")/.."
# every step writes under $RES; after each step the lot is packed into $OUT/session.tgz (a run cut off by its
# time limit still returns what finished; the device returns at most 8 files, so one archive carries them all)
FINAL=${OUT:-/tmp/out}; mkdir -p "$FINAL"
OUT=/tmp/ht_session; rm -rf "$OUT"; mkdir -p "$OUT"
pack() { tar czf "$FINAL/session.tgz" -C "$OUT" . ; }
STEPS=${STEPS:-"models demo e2e"}
if ls .whl/humming*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/humming*.whl .whl/gemlite*.whl \
    $(ls .whl/nvidia_cutlass*.whl 2>/dev/null)  # the CUTLASS headers, for a device-side build
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HT_FAILLOG=$OUT/gpu_failures.txt HT_TESTLOG=$OUT/gpu_testlog.txt
touch "$HT_FAILLOG"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
limited() {  # <limit s> <command...>: timeout, where a limit of 0 skips the command (to fit a call's 600 s)
  local limit=$1; shift
  [ "$limit" = 0 ] && { echo "(skipped: limit 0)"; return 0; }
  timeout -k 5 "$limit" "$@"
}
gpu_tests() {  # <limit s> <label> <pytest args...>
  local limit=$1 label=$2; shift 2
  stamp "pytest $label" | tee -a "$OUT/gpu_tests.txt"
  timeout -k 5 "$limit" python3 -m pytest -m gpu -q -n 16 -p no:cacheprovider "$@" 2>&1 \
    | grep -v -i "warn" | tail -4 >> "$OUT/gpu_tests.txt"
  echo "(exit ${PIPESTATUS[0]}; 124 = cut off by the ${limit} s limit)" >> "$OUT/gpu_tests.txt"
}
for step in $STEPS; do
  case $step in
    models)  gpu_tests ${MODELS_S:-170} models tests/test_grouped_kernels.py tests/test_act_quant_kernels.py tests/test_nn.py ;;
    presets) gpu_tests 130 presets tests/test_dense_kernels.py -k wna16_presets ;;
    verify)  gpu_tests ${VERIFY_S:-240} verify tests/test_dense_kernels.py tests/test_grouped_kernels.py \
               tests/test_act_quant_kernels.py tests/test_ops.py tests/test_nn.py \
               -k "gemv_words or wna16_presets or launch_replay or not dense" ;;
    tune)
      stamp tune
      timeout -k 5 ${TUNE_S:-300} python3 -m humming_triton.tune --suite ${TUNE_SUITES:-headline,decode} \
        ${TUNE_ONLY:+--only "$TUNE_ONLY"} ${TUNE_MATCH:+--match "$TUNE_MATCH"} ${TUNE_MISSING:+--missing} --jobs ${TUNE_JOBS:-12} > "$OUT/tune.txt" 2>&1
      cp autotune_configs/*.json "$OUT/" ;;
    tuneclean)  # a second tune pass over $TUNE_MATCH_CLEAN, only when no GPU test failed before it in this call (a new
                # kernel's keys are tuned only after its own tests passed: a crashed kernel would end the call)
      stamp tuneclean
      if grep -q '^FAILED' "$HT_FAILLOG"; then
        echo "skipped: $(grep -c '^FAILED' "$HT_FAILLOG") GPU test failures logged before it" > "$OUT/tuneclean.txt"
      else
        timeout -k 5 ${TUNE_CLEAN_S:-250} python3 -m humming_triton.tune --suite ${TUNE_SUITES:-headline,decode} \
          --match "$TUNE_MATCH_CLEAN" --jobs ${TUNE_JOBS:-12} > "$OUT/tuneclean.txt" 2>&1
        cp autotune_configs/*.json "$OUT/"
      fi ;;
    native)  # the native library: load the carried build, else build it here; its GPU tests; one ncu profile
      stamp native
      python3 -c "from cutlass_ext import native; import sys; w = native.unavailable(); print(w or 'native library loads'); sys.exit(1 if w else 0)" \
        > "$OUT/native.txt" 2>&1 || timeout -k 5 240 python3 -m cutlass_ext.build --arch 90 >> "$OUT/native.txt" 2>&1
      gpu_tests ${NATIVE_S:-150} native tests/test_native_decode.py tests/test_native_decode_act.py tests/test_act_quant_kernels.py \
        tests/test_scaled_mm_mx.py -k "native or grouped_kernel or global_scale or kernel_matches or non_finite or scaled_mm or through_the_op"
      limited ${NATIVE_NCU_S:-150} ncu --clock-control none -k regex:decode_mma --launch-skip ${NCU_SKIP:-0} --launch-count ${NCU_COUNT:-5} \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
        --section WarpStateStats --section Occupancy --section LaunchStats python3 scripts/native_probe.py \
        > "$OUT/native_ncu.txt" 2>&1
      limited ${NATIVE_SWEEP_S:-120} python3 scripts/native_probe.py --sweep --out "$OUT/native_sweep.json" > "$OUT/native_sweep.txt" 2>&1
      limited ${NATIVE_ACT_S:-100} python3 scripts/native_probe.py --family mma_decode_act --sweep \
        --out "$OUT/native_act_sweep.json" > "$OUT/native_act_sweep.txt" 2>&1 ;;
    groupedprobe)  # the grouped decode kernel at MoE mid-token rows: a wide config sweep, then ncu sections of
                   # $GROUPED_LAUNCHES (scripts/grouped_probe.py)         -> grouped_sweep.txt/json, grouped_ncu.txt
      stamp groupedprobe
      limited ${GROUPED_SWEEP_S:-200} python3 scripts/grouped_probe.py --sweep --out "$OUT/grouped_sweep.json" \
        > "$OUT/grouped_sweep.txt" 2>&1
      limited ${GROUPED_NCU_S:-120} ncu --clock-control none -k regex:decode_mma --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 scripts/grouped_probe.py ${GROUPED_LAUNCHES:+--launches "$GROUPED_LAUNCHES"} > "$OUT/grouped_ncu.txt" 2>&1 ;;
    abgrouped)  # same-run A/B of the grouped decode kernel: scripts/grouped_probe.py --sweep with each of $AB_LIBS
                # ("name:path ...", default "old:$AB_LIB") first, then with this checkout's library
                # (e.g. AB_LIBS="all80:cutlass_ext/_build/ab/libht_native_grouped_all80.so", an --decode-defines
                # build);
                # ABG_SCHEME: the experts' scheme (default w4a16; mxfp4, w4a8-mxfp4, ...)
                #                                                -> abg_<name>.txt/json, abg_new.txt/json
      stamp abgrouped
      for named in ${AB_LIBS:-old:$AB_LIB}; do
        limited ${ABG_S:-120} env HT_NATIVE_LIB="${named#*:}" python3 scripts/grouped_probe.py --sweep \
          --scheme ${ABG_SCHEME:-w4a16} --out "$OUT/abg_${named%%:*}.json" > "$OUT/abg_${named%%:*}.txt" 2>&1
      done
      limited ${ABG_S:-120} python3 scripts/grouped_probe.py --sweep --scheme ${ABG_SCHEME:-w4a16} \
        --out "$OUT/abg_new.json" > "$OUT/abg_new.txt" 2>&1 ;;
    passgrid)  # same-run A/B of the grouped decode kernel's grids (one process per scheme of $PG_SCHEMES): every
               # config on the expert grid and on the pass grid (grouped_probe --grids experts,passes)
               #                                                -> passgrid_<scheme>.txt/json
      stamp passgrid
      for sch in ${PG_SCHEMES:-w4a16 mxfp4 w4a8-mxfp4}; do
        limited ${PG_S:-120} python3 scripts/grouped_probe.py --sweep --scheme $sch --grids experts,passes \
          --tokens ${PG_TOKENS:-16,64} --out "$OUT/passgrid_$sch.json" > "$OUT/passgrid_$sch.txt" 2>&1
      done ;;
    ncu)  # stall reasons per SASS instruction of $NCU_LAUNCHES (native_probe --launches), and the sections
      stamp ncu
      limited ${NCU_S:-150} ncu --clock-control none -k regex:decode_mma --set full --import-source yes \
        -o "$OUT/decode" python3 scripts/native_probe.py ${NCU_LAUNCHES:+--launches "$NCU_LAUNCHES"} > "$OUT/ncu_log.txt" 2>&1
      ncu -i "$OUT/decode.ncu-rep" --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section Occupancy --section LaunchStats --section SourceCounters > "$OUT/ncu.txt" 2>&1
      ncu -i "$OUT/decode.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_sass.csv" 2>&1 ;;
    ab)  # $AB_LIBS ("name:path ..."; default "old:$AB_LIB") first, each to ab_<name>.*, then this checkout's build
      stamp ab
      for named in ${AB_LIBS:-old:$AB_LIB}; do
        limited ${AB_S:-110} env HT_NATIVE_LIB="${named#*:}" python3 scripts/native_probe.py --sweep --m ${AB_M:-1,16} \
          ${AB_SCHEMES:+--schemes $AB_SCHEMES} --out "$OUT/ab_${named%%:*}.json" > "$OUT/ab_${named%%:*}.txt" 2>&1
      done
      limited ${AB_S:-110} python3 scripts/native_probe.py --sweep --m ${AB_M:-1,16} \
        ${AB_SCHEMES:+--schemes $AB_SCHEMES} --out "$OUT/ab_new.json" > "$OUT/ab_new.txt" 2>&1 ;;
    cutlass)  # the sm_90a CUTLASS GEMMs: carried build or built here; GPU tests; variant sweep; memcheck on tails
      stamp cutlass
      # the carried objects (cutlass_ext/_build/obj) are reused: only missing or changed kernels compile here
      # the kernel set of the CPU-built library (every variant of the bf16 formats, the tuned five of the fp16 ones)
      # CUTLASS_BUILD_S=0: use the carried library as it is (no relink)
      limited ${CUTLASS_BUILD_S:-420} python3 -m cutlass_ext.build --arch 80,90,90a \
        --sm90-kernels "${CUTLASS_KERNELS:-0,2,4,6,8,10:0-13/1,3,5,7,9:0,1,3,4,6}" --jobs 16 > "$OUT/cutlass.txt" 2>&1
      python3 -c "from cutlass_ext import mixed_gemm as m; print(m.available() or {f: m.built_variants(f) for f in m.FORMATS})" \
        >> "$OUT/cutlass.txt" 2>&1
      gpu_tests ${CUTLASS_S:-200} cutlass tests/test_cutlass_sm90.py
      limited ${CUTLASS_SWEEP_S:-200} python3 scripts/native_probe.py --family cutlass_mixed --sweep \
        ${CUTLASS_M:+--m $CUTLASS_M} --out "$OUT/cutlass_sweep.json" > "$OUT/cutlass_sweep.txt" 2>&1
      for fam in ${CUTLASS_MEMCHECK_FAMILIES:-cutlass_mixed cutlass_mixed_shuffled}; do
        limited ${CUTLASS_MEMCHECK_S:-100} compute-sanitizer --tool memcheck --kernel-name kns=GemmUniversal \
          python3 scripts/native_probe.py --family $fam --odd >> "$OUT/cutlass_sanitize.txt" 2>&1
        echo "($fam memcheck exit $?)" >> "$OUT/cutlass_sanitize.txt"
      done ;;
    cutlassodd)  # memcheck of the CUTLASS families' tails only ($CUTLASS_MEMCHECK_FAMILIES)
      stamp cutlassodd
      for fam in ${CUTLASS_MEMCHECK_FAMILIES:-cutlass_mixed_shuffled}; do
        limited ${CUTLASS_MEMCHECK_S:-100} compute-sanitizer --tool memcheck --kernel-name kns=GemmUniversal \
          python3 scripts/native_probe.py --family $fam --odd >> "$OUT/cutlass_sanitize.txt" 2>&1
        echo "($fam memcheck exit $?)" >> "$OUT/cutlass_sanitize.txt"
      done ;;
    syncfree) gpu_tests ${SYNCFREE_S:-150} syncfree tests/test_sync_free.py tests/test_batch_invariant.py ;;
    sanitize)  # compute-sanitizer (Firecracker runtime) over the native kernel's tail shapes, every config
      stamp sanitize
      for tool in ${SANITIZE_TOOLS:-memcheck}; do
        timeout -k 5 ${SANITIZE_S:-100} compute-sanitizer --tool $tool --kernel-name kns=decode_mma \
          python3 scripts/native_probe.py --odd >> "$OUT/sanitize.txt" 2>&1; echo "($tool exit $?)" >> "$OUT/sanitize.txt"
      done ;;
    families)  # compute-sanitizer over one launch of every registered path (backend x family) on odd shapes,
               # memcheck over all of them, racecheck over the split-K and grouped ones (issue 15)
      stamp families
      # FAMILIES_SHARDS=N: N memcheck processes in parallel, each over every N-th path (one run of all of them
      # outlasted 150 s at 0177666; four shards of 150 s covered 393 paths and were all cut off at 44c86d2, H100)
      # (12 shards of 300 s covered 316 paths at 25b562e, H100, all cut off: each shard compiled its Triton kernels
      # under the sanitizer.)  So first the same shards without it (FAMILIES_PRIME_S): each compiles its own paths'
      # kernels into Triton's cache -- and checks them against the reference -- then memcheck loads them cached.
      n=${FAMILIES_SHARDS:-8}
      for i in $(seq 0 $((n - 1))); do
        timeout -k 5 ${FAMILIES_PRIME_S:-150} python3 scripts/sanitize_probe.py --shard $i/$n \
          > "$OUT/prime_shard_$i.txt" 2>&1 &
      done
      wait
      cat "$OUT"/prime_shard_*.txt > "$OUT/families_unsanitized.txt"; rm -f "$OUT"/prime_shard_*.txt
      for i in $(seq 0 $((n - 1))); do
        ( timeout -k 5 ${FAMILIES_MEMCHECK_S:-240} compute-sanitizer --tool memcheck \
            python3 scripts/sanitize_probe.py --shard $i/$n > "$OUT/memcheck_shard_$i.txt" 2>&1
          echo "(memcheck shard $i/$n exit $?)" >> "$OUT/memcheck_shard_$i.txt" ) &
      done
      wait
      cat "$OUT"/memcheck_shard_*.txt > "$OUT/sanitize_families.txt"; rm -f "$OUT"/memcheck_shard_*.txt
      timeout -k 5 ${FAMILIES_RACECHECK_S:-150} compute-sanitizer --tool racecheck \
        python3 scripts/sanitize_probe.py --split-k-and-grouped > "$OUT/racecheck_families.txt" 2>&1
      echo "(racecheck exit $?)" >> "$OUT/racecheck_families.txt" ;;
    tp)      # needs a machine of 2+ GPUs (nvidia-h200-x2): column / row parallel MLP and expert-parallel MoE
      stamp tp
      NCCL_NVLS_ENABLE=0 timeout -k 5 ${TP_S:-200} torchrun --nproc-per-node ${TP_GPUS:-2} scripts/tp_check.py \
        --out "$OUT" > "$OUT/tp.txt" 2>&1 ;;
    blockwise) stamp blockwise; limited ${BLOCKWISE_S:-120} python3 scripts/blockwise_probe.py "$OUT/blockwise_probe.json" \
               > "$OUT/blockwise_probe.txt" 2>&1 ;;
    scaledmm) stamp scaledmm; limited ${SCALEDMM_S:-90} python3 scripts/scaled_mm_probe.py "$OUT/scaled_mm_probe.json" \
               > "$OUT/scaled_mm_probe.txt" 2>&1 ;;
    actquant) stamp actquant; limited ${ACTQUANT_S:-90} python3 scripts/act_quant_probe.py "$OUT/act_quant_probe.json" \
               > "$OUT/act_quant_probe.txt" 2>&1 ;;  # the activation quantizers alone: variants A/B, % of copy
    actncu)  stamp actncu; limited ${ACTNCU_S:-90} ncu --clock-control none -k regex:act_quant --section SpeedOfLight \
               --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
               --section SchedulerStats python3 scripts/act_quant_ncu.py > "$OUT/act_quant_ncu.txt" 2>&1 ;;
    moebreak)  # MoE grouped GEMMs kernel by kernel (torch.profiler): auto and $MOEBREAK_FAMILIES' best, at
               # $MOEBREAK_CASES; then ncu sections of the auto call's kernels at $MOENCU_CASES
      stamp moebreak
      limited ${MOEBREAK_S:-150} python3 scripts/moe_breakdown.py ${MOEBREAK_CASES:+--cases "$MOEBREAK_CASES"} \
        --families "${MOEBREAK_FAMILIES:-}" --out "$OUT/moe_breakdown.json" > "$OUT/moe_breakdown.txt" 2>&1
      [ -z "${MOENCU_CASES:-}" ] || { limited ${MOENCU_S:-90} ncu --clock-control none -k regex:"${MOENCU_KERNELS:-device_kernel|decode}" --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats python3 scripts/moe_breakdown.py --once --cases "$MOENCU_CASES" \
        > "$OUT/moe_ncu.txt" 2>&1; } ;;
    files)   gpu_tests ${FILES_S:-150} files $GPU_TEST_FILES ;;
    intdecode)  # the integer-decode tile loops (dense.INT_DECODE_ACT): GPU tests, then the same-run A/B probe
      gpu_tests ${INTDEC_TEST_S:-120} intdecode tests/test_act_quant_kernels.py -k integer_decode
      stamp intdecode probe
      limited ${INTDEC_S:-240} python3 scripts/int_decode_probe.py ${INTDEC_M:+--m $INTDEC_M} \
        --out "$OUT/int_decode_probe.json" > "$OUT/int_decode_probe.txt" 2>&1 ;;
    new)     gpu_tests ${NEW_S:-150} new tests/test_dispatch.py tests/test_dense_kernels.py tests/test_grouped_kernels.py \
               -k "swapab or dispatch or torch_composed or split" ;;
    dense)   gpu_tests ${DENSE_S:-200} dense tests/test_dense_kernels.py -k every_format_family ;;
    matrix)  gpu_tests ${MATRIX_S:-420} matrix tests/ ;;  # the whole GPU suite (issue 15's GPU matrix)
    nativeop)
      stamp nativeop
      limited ${NATIVEOP_BUILD_S:-150} python3 -c "from cutlass_ext import native_op; print('built:', native_op.unavailable() or 'yes')" \
        > "$OUT/native_op.txt" 2>&1
      gpu_tests ${NATIVEOP_S:-100} nativeop tests/test_native_op.py tests/test_moe_pipeline.py ;;
    overhead) stamp overhead; timeout -k 5 120 python3 -m benchmarks.overhead --out "$OUT/overhead.json" > "$OUT/overhead.txt" 2>&1 ;;
    demo)    stamp demo; timeout -k 5 80 python3 -m humming_triton.demo --backend triton > "$OUT/demo.txt" 2>&1 ;;
    e2e)
      stamp e2e
      : > "$OUT/e2e.txt"
      for b in ${E2E_BATCHES:-1}; do  # decode batch sizes, each a run of its own (E2E_S / E2E_MOE_S each)
        sfx=$([ "$b" = 1 ] || echo "_b$b")
        echo "== batch $b" >> "$OUT/e2e.txt"
        timeout -k 5 ${E2E_S:-110} python3 -m benchmarks.e2e ${E2E_COMPILE---compile} --batch $b \
          --schemes ${E2E_SCHEMES:-w4a16,w8a16,mxfp4} --out "$OUT/e2e_llama$sfx.json" >> "$OUT/e2e.txt" 2>&1
        [ -n "${E2E_DENSE_ONLY:-}" ] || timeout -k 5 ${E2E_MOE_S:-110} python3 -m benchmarks.e2e ${E2E_COMPILE---compile} \
          --batch $b --model qwen3_moe --hidden 2048 --layers 4 --backend ${E2E_MOE_BACKEND:-auto} --schemes w4a16,mxfp4 \
          ${E2E_MOE_EXTRA:-} --out "$OUT/e2e_moe$sfx.json" >> "$OUT/e2e.txt" 2>&1
      done
      # which switches this device's table should turn on, up to which batch (commit them with --write on the CPU)
      python3 -m benchmarks.switch_verdicts $(ls "$OUT"/e2e_llama*.json "$OUT"/e2e_moe*.json 2>/dev/null) \
        --commit "${HT_GIT_COMMIT:-unknown}" > "$OUT/switch_verdicts.txt" 2>&1
      # HF generate with a static KV cache, eager and compiled (reduce-overhead), decode tokens/s vs bf16
      [ -z "${E2E_GENERATE:-}" ] || timeout -k 5 ${E2E_GENERATE_S:-150} python3 -m benchmarks.e2e --generate \
        --schemes ${E2E_SCHEMES:-w4a16,w8a16,mxfp4} --out "$OUT/e2e_generate.json" >> "$OUT/e2e.txt" 2>&1 ;;
    bench)
      stamp bench
      timeout -k 5 ${BENCH_S:-260} python3 -m benchmarks --suite headline --out "$OUT/bench" --no-cold-start \
        ${PEER_BUDGET_S:+--peer-budget-s $PEER_BUDGET_S} ${BENCH_COMPARE:+--compare "$BENCH_COMPARE"} ${BENCH_ARGS:-} \
        > "$OUT/bench_log.txt" \
        2> "$OUT/bench_stderr.txt" ;;
    decode)
      stamp decode
      timeout -k 5 ${DECODE_BENCH_S:-200} python3 -m benchmarks --suite decode --out "$OUT/decode" --no-cold-start \
        ${PEER_BUDGET_S:+--peer-budget-s $PEER_BUDGET_S} ${DECODE_COMPARE:+--compare "$DECODE_COMPARE"} ${DECODE_ARGS:-} \
        > "$OUT/decode_log.txt" \
        2> "$OUT/decode_stderr.txt" ;;
    moe)     # the MoE issue's grouped GEMMs: Qwen3-30B-A3B and Mixtral-8x7B experts, w4a16 / mxfp4 / w4a8-mxfp4
      stamp moe
      timeout -k 5 ${MOE_BENCH_S:-300} python3 -m benchmarks --suite moe --out "$OUT/moe" --no-cold-start \
        ${PEER_BUDGET_S:+--peer-budget-s $PEER_BUDGET_S} ${MOE_COMPARE:+--compare "$MOE_COMPARE"} ${MOE_ARGS:-} \
        > "$OUT/moe_log.txt" 2> "$OUT/moe_stderr.txt" ;;
    act)     # every activation-quantized scheme at M = 1 / 16 / 256 / 4096 with peers (the FP8 / INT8 issue)
      stamp act
      timeout -k 5 ${ACT_BENCH_S:-200} python3 -m benchmarks --suite act --out "$OUT/act" --no-cold-start \
        ${PEER_BUDGET_S:+--peer-budget-s $PEER_BUDGET_S} ${ACT_COMPARE:+--compare "$ACT_COMPARE"} \
        > "$OUT/act_log.txt" 2> "$OUT/act_stderr.txt" ;;
    invariant)
      stamp invariant
      timeout -k 5 ${INV_S:-150} python3 -m benchmarks --suite headline --only dense --no-cold-start \
        --methods humming_triton,humming_triton_invariant --schemes ${INV_SCHEMES:-w4a16,w8a16,mxfp4} \
        --out "$OUT/invariant" > "$OUT/invariant_log.txt" 2>&1 ;;
    *) echo "unknown step $step" ;;
  esac
  pack
done
stamp done
cat "$OUT/gpu_tests.txt" 2>/dev/null; echo "failures logged: $(grep -c '^FAILED' "$HT_FAILLOG")"
tail -12 "$OUT/e2e.txt" 2>/dev/null
