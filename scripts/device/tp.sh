# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Issue 36's tensor-parallel rows on the GPUs of this host: the tensor-parallel and NCCL window GPU tests
# (TP_TEST_FILTER; empty skips them), NCCL's all-reduce per call for one 7B / 72B hidden row and more (bench
# --allreduce, skipped with TP_ALLREDUCE=0), then each TPAR_SPECS entry preset:quant:input lengths:ranks:load
# format[:VAR=value,...] (dummy: --load-format dummy, random weights built in memory; synth: a synthesized checkpoint
# on disk; the optional last field sets environment variables for that run alone, e.g. QINFER_QKS=2) with 2048
# generated (TPAR_GEN), each entry under TPAR_TIMEOUT seconds (default 400); tests/cli/tp_abort.sh (the watchdog's timeout; TP_ABORT=0 skips it).
# Rows to $OUT/tp.log, JSON per entry.
if [ -n "${TP_TEST_FILTER-*CudaTensorParallel*:*CudaNcclWindow*}" ]; then
    t_test=$(date +%s)
    timeout -k 10 "${GPU_TEST_TIMEOUT:-600}" build-device/tests/qinfer_tests --gtest_filter="${TP_TEST_FILTER-*CudaTensorParallel*:*CudaNcclWindow*}" >"$OUT/tp-test.log" 2>&1
    note "tp tests ($(( $(date +%s) - t_test )) s): $(grep -E '^\[  PASSED  \]|FAILED TEST|^\[  SKIPPED \] [0-9]' "$OUT/tp-test.log" | tr '\n' ' ')"
    grep -E "^\[ tp " "$OUT/tp-test.log"
    grep -E "Failure|rror" -A6 "$OUT/tp-test.log" | head -60
fi
if [ "${TP_ABORT:-1}" != 0 ]; then
    bash tests/cli/tp_abort.sh "$Q" 2>&1 | tee -a "$OUT/tp.log"
fi
if [ "${TP_ALLREDUCE:-1}" != 0 ]; then
    timeout -k 10 120 "$Q" bench --allreduce --tp "${TP_ALLREDUCE_RANKS:-2}" --hidden 3584,8192 --rows 1,8,256 --json "$OUT/allreduce.json" 2>&1 | tee -a "$OUT/tp.log"
fi
for spec in ${TPAR_SPECS:-qwen2.5-7b:bf16:1:1:dummy qwen2.5-7b:bf16:1:2:dummy}; do
    IFS=: read -r p q lens ranks load vars <<<"$spec"
    load_args=()
    [ "${load:-dummy}" = dummy ] && load_args=(--load-format dummy)
    echo "== $spec" | tee -a "$OUT/tp.log"
    env ${vars//,/ } timeout -k 10 "${TPAR_TIMEOUT:-400}" "$Q" bench --preset "$p" --quant "$q" --input-lens "$lens" --tp "$ranks" --gen "${TPAR_GEN:-2048}" \
        "${load_args[@]}" --json "$OUT/tp-${spec//[:,=]/-}.json" 2>&1 | grep -E "^\| [^M-]|^card|^tensor parallel:|error|rror" | tee -a "$OUT/tp.log"
done
