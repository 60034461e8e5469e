# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
build-device/tests/qinfer_tests --gtest_filter='*Attention*:*Gemv*:*Quant*' 2>&1 | grep -E "^\[ kernel \]|FAILED|Failure|PASSED" | tee "$OUT/kernels.log" | head -20
