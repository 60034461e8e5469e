# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Prefill over a quantized cache on its bf16 dequantization (kv_dequant.cu, CudaQwenEngine::prefill_via_bf16): the
# quantized-cache tests, then Qwen2.5-7B YaRN at 129024 with GPTQ-Int4 weights and each cache of KVP_SPECS
# (kv:QINFER_PREFILL_DEQUANT value; bf16 is the baseline), 2048 generated, one JSON each.
build-device/tests/qinfer_tests --gtest_filter='*QuantAttention*:*KvBackends*:*GoldenCuda*:CudaKv*' >"$OUT/kvp-tests.log" 2>&1
note "quantized-cache tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/kvp-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/kvp-tests.log" | head -30
grep -E "^\[ kv \]" "$OUT/kvp-tests.log"
for spec in ${KVP_SPECS:-int8:1 bf16:1 int8:0 fp8:1}; do
    IFS=: read -r kv dq <<<"$spec"
    QINFER_PREFILL_DEQUANT=$dq "$Q" bench --preset qwen2.5-7b-yarn --quant gptq-int4 --kv-dtype $kv --input-lens 129024 --gen "${AB_GEN:-2048}" \
        --json "$OUT/kvp-$kv-$dq.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/dequant $dq /" | tee -a "$OUT/kv-prefill.log"
done
