# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Warps per row group of the quantized GEMVs (QINFER_QKS), per format: the decode profile's GEMV lines and tokens/s.
for q in ${TUNE_QUANTS:-gptq-int4}; do
    for ks in 0 1 2 4 8; do
        echo "-- $q QINFER_QKS=$ks"
        QINFER_QKS=$ks QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-7b --quant $q --input-lens 1 --gen 128 2>&1 |
            tee -a "$OUT/tune.log" | grep -E "gemv|^\| qwen" | grep -v lm_head
    done
done
