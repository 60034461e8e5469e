# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Fewer, longer decode splits: QINFER_DECODE_SPLIT_KEYS 1024 (the default until e9c0fa9) against SPLIT_KEYS_VALUES (2048),
# alternated: the decode attention on 7B's shapes at 129024 keys (one wave of 264 blocks instead of two), then rows
# end to end (SPLIT_KEYS_SPECS preset:quant:lengths, AB_GEN tokens generated, default 2048).
for keys in 1024 ${SPLIT_KEYS_VALUES:-2048} 1024 ${SPLIT_KEYS_VALUES:-2048}; do
    QINFER_DECODE_SPLIT_KEYS=$keys QINFER_DECODE_TIMING_LEN=129024 build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BShapes' 2>&1 |
        grep -E "^\[ kernel \]|FAILED" | sed "s/^/split keys $keys /" | tee -a "$OUT/split-keys.log"
done
AB_REPS=${AB_REPS:-1} ab QINFER_DECODE_SPLIT_KEYS "1024 ${SPLIT_KEYS_VALUES:-2048}" \
    "${SPLIT_KEYS_SPECS:-qwen2.5-7b-yarn:bf16:129024 qwen2.5-7b-yarn:gptq-int4:129024}" split-keys
