# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Quantized KV caches on the GPU: kernels and end to end against the CPU cache of the same dtype.
build-device/tests/qinfer_tests --gtest_filter='*QuantAttention*:*CudaKv*:*KvBackends*:*Batch*cuda*:*LongContext*' 2>&1 |
    tee "$OUT/kv-test.log" | grep -E "^\[ kv \]|FAILED|Failure|PASSED|Expected|actual|exception" | head -40
