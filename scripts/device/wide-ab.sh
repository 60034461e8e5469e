# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Balanced GEMV tables of up to 96 rows for single tokens (0.5B / 1.5B gate_up leave the row kernels; default) against
# 32 rows only (QINFER_GEMV_WIDE=0): the GEMV and golden tests, then rows alternated AB_REPS times (default 2) for
# WIDE_SPECS.
build-device/tests/qinfer_tests --gtest_filter='OddShapes/Gemv.*:*GoldenCuda*' >"$OUT/wide-tests.log" 2>&1
note "GEMV / golden tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/wide-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/wide-tests.log" | head -20
ab QINFER_GEMV_WIDE "1 0" "${WIDE_SPECS:-qwen2.5-1.5b:bf16:1 qwen2.5-0.5b:bf16:1}" wide
