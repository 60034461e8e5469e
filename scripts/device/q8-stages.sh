# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Is the raw-code int8/fp8 decode kernel short of bytes in flight? Its correctness tests with 6 stages, then the
# kernel at 7B's shapes (CudaDecodeTimings.Qwen7BQuantCaches) with QINFER_Q8_STAGES 3 and 6, and with 3 and 4 blocks
# per SM (QINFER_DECODE_BLOCKS_PER_SM; more warps per SM, more splits), then Qwen2.5-7B YaRN GPTQ-Int4 with an int8
# cache at 129024 (2048 generated) with 3 and 6 stages, alternated Q8S_REPS times (default 1).
QINFER_Q8_STAGES=6 build-device/tests/qinfer_tests --gtest_filter='*QuantAttention*:*KvBackends*' >"$OUT/q8s-tests.log" 2>&1
note "quantized-cache tests, 6 stages: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/q8s-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/q8s-tests.log" | head -30
for cfg in "3 0" "6 0" "3 3" "3 4"; do
    read -r st bps <<<"$cfg"
    extra=()
    [ "$bps" != 0 ] && extra=("QINFER_DECODE_BLOCKS_PER_SM=$bps")
    env QINFER_Q8_STAGES="$st" "${extra[@]}" build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BQuantCaches' 2>&1 | grep -E "^\[ kernel \]|FAILED" |
        sed "s/^/stages $st blocks-per-sm $bps /" | tee -a "$OUT/q8-stages.log"
done
for rep in $(seq "${Q8S_REPS:-1}"); do
    for st in 3 6; do
        QINFER_Q8_STAGES=$st "$Q" bench --preset qwen2.5-7b-yarn --quant gptq-int4 --kv-dtype int8 --input-lens 129024 --gen "${AB_GEN:-2048}" \
            --json "$OUT/q8s-$st-$rep.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/stages $st /" | tee -a "$OUT/q8-stages.log"
    done
done
