# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The raw-code int8/fp8 decode kernel's stages of codes in flight (QINFER_Q8_STAGES 6, the default, or 3): its
# correctness tests with Q8S_TEST stages (default 3, the one not the default), the kernel at 7B's shapes
# (CudaDecodeTimings.Qwen7BQuantCaches) with each, then Qwen2.5-7B YaRN GPTQ-Int4 with an int8 cache at 129024 (2048
# generated) with each, alternated Q8S_REPS times (default 2).
QINFER_Q8_STAGES=${Q8S_TEST:-3} build-device/tests/qinfer_tests --gtest_filter='*QuantAttention*:*KvBackends*' >"$OUT/q8s-tests.log" 2>&1
note "quantized-cache tests, ${Q8S_TEST:-3} stages: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/q8s-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/q8s-tests.log" | head -30
for st in 3 6; do
    QINFER_Q8_STAGES=$st build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BQuantCaches' 2>&1 |
        grep -E "^\[ kernel \].*tensor copies|FAILED" | sed "s/^/stages $st /" | tee -a "$OUT/q8-stages.log"
done
for rep in $(seq "${Q8S_REPS:-2}"); do
    for st in 3 6; do
        QINFER_Q8_STAGES=$st "$Q" bench --preset qwen2.5-7b-yarn --quant gptq-int4 --kv-dtype int8 --input-lens 129024 \
            --gen "${AB_GEN:-2048}" --json "$OUT/q8s-$st-$rep.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/stages $st /" | tee -a "$OUT/q8-stages.log"
    done
done
