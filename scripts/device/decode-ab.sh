# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Attention A/B: the older kernels (QINFER_DECODE_ATTN=simt, QINFER_PREFILL_ATTN=tiled) against the defaults (tensor-core
# decode, pipelined prefill), kernels and end to end, same run.
build-device/tests/qinfer_tests --gtest_filter='*Attention*' 2>&1 | grep -E "^\[ kernel \]|FAILED|PASSED" | tee "$OUT/decode-ab-kernels.log"
for p in qwen2.5-0.5b qwen2.5-7b; do
    for k in simt:tiled tc:pipelined; do
        echo "-- $p attention ${k%%:*} / ${k##*:}"
        QINFER_DECODE_ATTN=${k%%:*} QINFER_PREFILL_ATTN=${k##*:} "$Q" bench --preset $p --input-lens 1,6144,30720 --gen 256 \
            --json "$OUT/attn-ab-$p-${k%%:*}.json" 2>&1 | tee -a "$OUT/decode-ab.log" | grep -E "^\| qwen"
    done
done
