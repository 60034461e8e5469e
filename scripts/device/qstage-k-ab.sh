# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Where the quantized ring GEMVs copy a plain bf16 input into shared memory before their loop (qgemv.cu,
# stage_plain_input): from k 8192 (the default: 7B's down only) against QSTAGE_K_VALUES (default 3584: 7B's o_proj
# too, and 0.5B's down at 4864, but not 0.5B's o_proj at 896), the quantized GEMV tests under the lower bound first,
# then rows for QSTAGE_K_SPECS alternated AB_REPS times (default 2). The open question of
# bench/results/2026-11-27-h100-qgemv-stage: 7B's o_proj gained ~0.8% staged (one call, all k), 0.5B Int4 lost 1.9%
# (both its inputs staged), which of the two is not measured. QSTAGE_K_TESTS=0 leaves the tests out.
lower=${QSTAGE_K_VALUES:-3584}
[ "${QSTAGE_K_TESTS:-1}" = 0 ] || {
QINFER_QGEMV_STAGE_MIN_K=${lower%% *} build-device/tests/qinfer_tests --gtest_filter='*Quant*:*GoldenCuda*-*Timings*' \
    >"$OUT/qstage-k-tests.log" 2>&1
note "quantized / golden tests, plain inputs staged from k ${lower%% *}: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/qstage-k-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/qstage-k-tests.log" | head -20
}
ab QINFER_QGEMV_STAGE_MIN_K "8192 $lower" "${QSTAGE_K_SPECS:-qwen2.5-7b:gptq-int4:1 qwen2.5-0.5b:gptq-int4:1}" qstage-k
