# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Prefill pass length for dequantized weights (each pass dequantizes every projection once): 7B GPTQ-Int4 at 30720
# with QINFER_PREFILL_CHUNK forced, alternated.
n_chunk=0
for c in 1024 4096 2048 1024 4096; do
    n_chunk=$((n_chunk + 1))  # (not inside the pipeline: its commands run in subshells)
    QINFER_PREFILL_CHUNK=$c "$Q" bench --preset qwen2.5-7b --quant gptq-int4 --input-lens 30720 --gen 2048 \
        --json "$OUT/chunk-7b-int4-$c-$n_chunk.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/chunk=$c /" | tee -a "$OUT/chunk-ab.log"
done
