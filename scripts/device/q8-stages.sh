# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The raw-code int8/fp8 decode kernel's pipeline: stages of codes in flight (QINFER_Q8_STAGES 3 or 6) and how a
# stage is released (QINFER_Q8_FREE=1: per-stage mbarriers, not a block barrier per tile). Its correctness tests in
# the Q8S_TEST setting, the kernel at 7B's shapes (CudaDecodeTimings.Qwen7BQuantCaches) in each Q8S_CONFIGS setting
# ("stages free" pairs), then Qwen2.5-7B YaRN GPTQ-Int4 with an int8 cache at 129024 (2048 generated) in each
# setting, alternated Q8S_REPS times (default 2).
read -r st fr <<<"${Q8S_TEST:-6 1}"
QINFER_Q8_STAGES=$st QINFER_Q8_FREE=$fr build-device/tests/qinfer_tests --gtest_filter='*QuantAttention*:*KvBackends*' >"$OUT/q8s-tests.log" 2>&1
note "quantized-cache tests, stages $st free $fr: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/q8s-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/q8s-tests.log" | head -30
configs=${Q8S_CONFIGS:-"3,0 6,0 6,1"}
for cfg in $configs; do
    IFS=, read -r st fr <<<"$cfg"
    QINFER_Q8_STAGES=$st QINFER_Q8_FREE=$fr build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BQuantCaches' 2>&1 |
        grep -E "^\[ kernel \].*tensor copies|FAILED" | sed "s/^/stages $st free $fr /" | tee -a "$OUT/q8-stages.log"
done
for rep in $(seq "${Q8S_REPS:-2}"); do
    for cfg in $configs; do
        IFS=, read -r st fr <<<"$cfg"
        QINFER_Q8_STAGES=$st QINFER_Q8_FREE=$fr "$Q" bench --preset qwen2.5-7b-yarn --quant gptq-int4 --kv-dtype int8 --input-lens 129024 \
            --gen "${AB_GEN:-2048}" --json "$OUT/q8s-$st-$fr-$rep.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/stages $st free $fr /" | tee -a "$OUT/q8-stages.log"
    done
done
