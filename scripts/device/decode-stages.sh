# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Decode attention K/V stages (QINFER_DECODE_STAGES 2 or 3; 3 is the default at head_dim 128, two blocks per SM),
# alternated: kernel timings on 7B's shapes, the decode tests under each, then BF16 rows end to end (DECODE_ROW_SPECS
# preset:lengths).
cfgs=${DECODE_CFGS:-2 3 2 3}
for st in $cfgs; do
    echo "-- stages $st" | tee -a "$OUT/decode-stages.log"
    QINFER_DECODE_STAGES=$st build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.*' 2>&1 |
        grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/decode-stages.log"
done
for st in $(printf '%s\n' $cfgs | sort -u); do
    QINFER_DECODE_STAGES=$st build-device/tests/qinfer_tests \
        --gtest_filter='Lengths/Attention.*:TinyHeads/*:Kinds/QuantAttention.*:*KvBackends*:*Batch*:*GoldenCuda*' >"$OUT/decode-tests-$st.log" 2>&1
    note "decode tests, $st stages: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/decode-tests-$st.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/decode-tests-$st.log" | head -20
done
for spec in ${DECODE_ROW_SPECS:-qwen2.5-7b:30720}; do
    for st in $cfgs; do
        QINFER_DECODE_STAGES=$st "$Q" bench --preset ${spec%%:*} --input-lens ${spec##*:} --gen 2048 \
            --json "$OUT/decode-row-${spec%%:*}-$st-$RANDOM.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/stages $st /" | tee -a "$OUT/decode-stages.log"
    done
done
