# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
build-device/tests/qinfer_tests --gtest_filter='*Quant*:*GoldenCuda*' 2>&1 | grep -E "golden \] cuda .*(gptq|awq|autoround|nf4)|FAILED|Failure|PASSED|Expected|actual|exception" | head -40
