# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The 4-bit / 8-bit o_proj and down GEMVs with the deep ring (QINFER_QRING_DEEP=1: twice the code loads in flight per
# lane, two blocks per SM): the quantized GEMV tests (both rings) and kernel timings, then the quantized rows
# alternated off / on.
build-device/tests/qinfer_tests --gtest_filter='OddShapes/QuantGemv.*:CudaQuant.DecodeGemvTimings' >"$OUT/ring-deep-test.log" 2>&1
note "quantized GEMV tests with the deep ring: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/ring-deep-test.log" | tr '\n' ' ')"
grep -E "qgemv .*(o_proj|down) .*m 1" "$OUT/ring-deep-test.log"
ab QINFER_QRING_DEEP "0 1" "${RING_DEEP_SPECS:-qwen2.5-7b:gptq-int4:1,30720 qwen2.5-7b:gptq-int8:1 qwen2.5-7b:awq:1 qwen2.5-0.5b:gptq-int4:1}" ring-deep-ab
