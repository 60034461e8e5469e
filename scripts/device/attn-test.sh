# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The attention kernels alone (CPU-reference checks and their timings), quicker than gpu-test.
build-device/tests/qinfer_tests --gtest_filter="${ATTN_TEST_FILTER:-*Attention*}" >"$OUT/attn-test.log" 2>&1
note "attention tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/attn-test.log" | tr '\n' ' ')"
grep -E "^\[ kernel \] attention_prefill" "$OUT/attn-test.log"
grep -E "Failure" -A6 "$OUT/attn-test.log" | head -40
