# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The int8-cache decode attention on raw codes (attention_decode_q8.cu) against the cp.async kernel with its
# dequantization pass (QINFER_DECODE_TMA=0): the quantized-attention and KV tests with it on (kernel timings at 4097
# and 129024 keys, both kernels), then Qwen2.5-7B YaRN at 129024 with an int8 cache and Q8_SPECS weights, alternated
# (decode tokens/s is issue 6's comparison against the bf16 cache).
build-device/tests/qinfer_tests --gtest_filter='*QuantAttention*:*KvBackends*:*GoldenCuda*' >"$OUT/q8-tests.log" 2>&1
note "int8 decode tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/q8-tests.log" | tr '\n' ' ')"
grep -E "^\[ kernel \] attention_decode|^\[ kv \]" "$OUT/q8-tests.log" | tee -a "$OUT/q8-decode.log"
grep -E "Failure" -A6 "$OUT/q8-tests.log" | head -30
for kv in ${Q8_KV:-int8 fp8}; do
    for q in ${Q8_WEIGHTS:-gptq-int4}; do
        for v in 0 1; do
            QINFER_DECODE_TMA=$v "$Q" bench --preset qwen2.5-7b-yarn --quant $q --kv-dtype $kv --input-lens 129024 --gen "${AB_GEN:-2048}" \
                --json "$OUT/q8-$q-$kv-$v.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/tma $v /" | tee -a "$OUT/q8-decode.log"
        done
    done
done
