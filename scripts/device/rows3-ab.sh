# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# One-warp row GEMVs at three blocks per SM where k <= 2048 (the default) against two everywhere
# (QINFER_GEMV_ROWS_BLOCKS=2): the GEMV, fused-QKV, golden and batch tests under the default (ROWS3_TESTS=0 skips
# them), then rows for ROWS3_SPECS alternated AB_REPS times (default 2).
if [[ ${ROWS3_TESTS:-1} != 0 ]]; then
    build-device/tests/qinfer_tests --gtest_filter='OddShapes/Gemv.*:CudaOps.*:*GoldenCuda*:*Batch*-*Timings*' >"$OUT/rows3-tests.log" 2>&1
    note "GEMV / CudaOps / golden / batch tests, rows at three blocks where k <= 2048: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/rows3-tests.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/rows3-tests.log" | head -20
fi
AB_LABEL="rows3 " ab_configs rows3 "${AB_REPS:-2}" "${ROWS3_SPECS:-qwen2.5-0.5b:bf16:1 qwen2.5-1.5b:bf16:1}" "two auto" \
    "two QINFER_GEMV_ROWS_BLOCKS=2" "auto"
