# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The balanced BF16 GEMV against the row kernels (QINFER_GEMV_BALANCED=0): the GEMV tests, kernel timings, then decode
# of 0.5B / 1.5B / 7B BF16 with the settings alternated (GEMV_AB_MODES: values of QINFER_GEMV_BALANCED), and a decode
# profile of 7B per GEMV_AB_PROFILE setting.
build-device/tests/qinfer_tests --gtest_filter='*Gemv.*:*GoldenCuda*:*Batch*' >"$OUT/gemv-test.log" 2>&1
note "gemv/golden/batch tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/gemv-test.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/gemv-test.log" | head -30
build-device/tests/qinfer_tests --gtest_filter='CudaOps.GemvTimings' 2>&1 | grep -E "^\[ kernel \]|FAILED" | tee "$OUT/gemv-kernels.log"
for p in ${GEMV_AB_PRESETS:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b}; do
    for rep in 1 2; do
        for b in ${GEMV_AB_MODES:-0 1}; do
            QINFER_GEMV_BALANCED=$b "$Q" bench --preset $p --input-lens 1 --gen 512 --json "$OUT/gemv-ab-$p-$b-$rep.json" 2>&1 |
                grep -E "^\| qwen" | sed "s/^/balanced=$b /" | tee -a "$OUT/gemv-ab.log"
        done
    done
done
for b in ${GEMV_AB_PROFILE-0 1}; do
    QINFER_GEMV_BALANCED=$b QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-7b --input-lens 1 --gen 128 2>&1 |
        grep -E "^  |profile" | sed "s/^/balanced=$b /" | tee -a "$OUT/gemv-ab.log"
done
