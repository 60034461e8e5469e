# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# The largest batch of Qwen2.5-7B at 8192 + 16 tokens per KV dtype and weight format (buffers allocated, nothing run).
for q in ${MAXB_QUANTS:-bf16 gptq-int4}; do
    for kv in bf16 fp8 int8 int4; do
        "$Q" bench --preset qwen2.5-7b --quant $q --kv-dtype $kv --max-batch --input-lens 8192 --gen 16 \
            --json "$OUT/max-batch-7b-$q-kv$kv.json" 2>&1 | tee -a "$OUT/max-batch.log" | grep -E "^\| qwen"
    done
done
