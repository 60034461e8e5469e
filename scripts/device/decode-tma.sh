# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Decode attention tiles by tensor copies (the default on sm_90a for bf16 caches) against cp.async
# (QINFER_DECODE_TMA=0): kernel timings on 7B's and 0.5B's shapes (both kernels), the attention and end-to-end tests
# with the tensor-copy kernel in use, then rows end to end (DECODE_TMA_SPECS preset:quant:lengths), alternated,
# AB_GEN tokens generated (default 2048).
build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.*' 2>&1 | grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/decode-tma.log"
build-device/tests/qinfer_tests \
    --gtest_filter='Lengths/Attention.*:LongContext/*:TinyHeads/*:*AttentionDecodeBatch*:*GoldenCuda*:*KvBackends*:*Batch*' >"$OUT/decode-tma-tests.log" 2>&1
note "decode tests (tensor copies on): $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/decode-tma-tests.log" | tr '\n' ' ')"
grep -E "^\[ kernel \] attention_decode" "$OUT/decode-tma-tests.log" | tee -a "$OUT/decode-tma.log"
grep -E "Failure" -A6 "$OUT/decode-tma-tests.log" | head -30
AB_REPS=${AB_REPS:-1} ab QINFER_DECODE_TMA "0 1" \
    "${DECODE_TMA_SPECS:-qwen2.5-0.5b:bf16:1 qwen2.5-7b:bf16:30720 qwen2.5-7b-yarn:gptq-int4:129024 qwen2.5-7b-yarn:bf16:129024}" decode-tma
