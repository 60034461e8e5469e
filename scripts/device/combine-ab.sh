# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The decode attention's splits merged by the split kernel's last block of each KV head (the default on this branch)
# against the separate combine kernel (QINFER_DECODE_COMBINE=kernel): the decode tests (each case with and without),
# kernel timings on 7B's and 0.5B's shapes, then rows end to end (COMBINE_SPECS), alternated, AB_REPS times; then the
# same for the fewest keys per split (MIN_SPLIT_VALUES, MIN_SPLIT_SPECS).
build-device/tests/qinfer_tests --gtest_filter='Lengths/Attention.*:LongContext/*:*AttentionDecodeBatch*:*QuantAttention*:*GoldenCuda*:*KvBackends*:*Batch*' \
    >"$OUT/combine-tests.log" 2>&1
note "decode tests (fused combine cases included): $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/combine-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/combine-tests.log" | head -30
build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.*' 2>&1 | grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/combine-ab.log"
AB_REPS=${AB_REPS:-2} ab QINFER_DECODE_COMBINE "kernel last-block" \
    "${COMBINE_SPECS:-qwen2.5-0.5b:bf16:1 qwen2.5-0.5b:gptq-int4:1 qwen2.5-1.5b:bf16:1 qwen2.5-7b:bf16:1,30720}" combine-ab
# Fewer, longer splits at short contexts (fewer partial rows for the last block to merge): QINFER_DECODE_MIN_SPLIT.
for ms in ${MIN_SPLIT_VALUES:-64 256}; do
    QINFER_DECODE_MIN_SPLIT=$ms build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.*' 2>&1 | grep -E "^\[ kernel \]|FAILED" |
        sed "s/^/min split $ms /" | tee -a "$OUT/combine-ab.log"
done
AB_REPS=${AB_REPS:-2} ab QINFER_DECODE_MIN_SPLIT "${MIN_SPLIT_VALUES:-64 256}" "${MIN_SPLIT_SPECS:-qwen2.5-0.5b:bf16:1 qwen2.5-7b:bf16:1}" min-split-ab
