# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Knobs timed in one run: decode splits per SM (QINFER_DECODE_BLOCKS_PER_SM) on the kernels, the BF16 GEMV's weight
# prefetch ahead of the fused RMSNorm (QINFER_GEMV_PREFETCH, alternated), prefill chunk size (QINFER_PREFILL_CHUNK) on
# 7B's time to first token at 30720.
for b in ${TUNE_BLOCKS:-2 3 4 8}; do
    echo "-- QINFER_DECODE_BLOCKS_PER_SM=$b"
    QINFER_DECODE_BLOCKS_PER_SM=$b build-device/tests/qinfer_tests \
        --gtest_filter='Lengths/Attention.*/15:Lengths/Attention.*/13:LongContext/*' 2>&1 | grep -E "attention_decode \(tensor" | tee -a "$OUT/tune.log"
done
for p in qwen2.5-0.5b qwen2.5-7b; do
    for pf in 0 1 0 1; do
        echo "-- $p QINFER_GEMV_PREFETCH=$pf"
        QINFER_GEMV_PREFETCH=$pf "$Q" bench --preset $p --input-lens 1 --gen 512 2>&1 | tee -a "$OUT/tune.log" | grep -E "^\| qwen"
    done
done
for ch in ${TUNE_CHUNKS:-1024 2048 4096}; do
    echo "-- QINFER_PREFILL_CHUNK=$ch"
    QINFER_PREFILL_CHUNK=$ch "$Q" bench --preset qwen2.5-7b --input-lens 30720 --gen 32 2>&1 | tee -a "$OUT/tune.log" | grep -E "^\| qwen"
done
