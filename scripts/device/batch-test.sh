# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Static batches on the GPU: the batched kernels against the CPU, and a batch step against each sequence alone.
build-device/tests/qinfer_tests --gtest_filter='*Batch*:*ArgmaxRows*' 2>&1 | tee "$OUT/batch-test.log" |
    grep -E "FAILED|Failure|PASSED|Expected|actual|exception|OK \]" | head -40
