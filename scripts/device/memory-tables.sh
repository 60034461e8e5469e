# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Issue 6's memory tables in the seed's form: Qwen2.5-7B generating 1024 tokens at batch 1..100 and batch 1 at
# lengths 512..8192, BF16 and Int8/Int4 weights, without and with KV cache quantization (int8, as the seed).
for q in ${TABLE_QUANTS:-bf16 gptq-int8 gptq-int4}; do
    for kv in ${TABLE_KVS:-bf16 int8}; do
        "$Q" bench --preset qwen2.5-7b --quant $q --kv-dtype $kv --input-lens 1 --gen 1024 --batch ${TABLE_BATCHES:-1,4,16,32,64,100} \
            --json "$OUT/batch-7b-$q-kv$kv.json" 2>&1 | tee -a "$OUT/memory.log" | grep -E "^\| qwen"
        "$Q" bench --preset qwen2.5-7b --quant $q --kv-dtype $kv --input-lens 512,1024,2048,4096,8192 --gen 1 \
            --json "$OUT/length-7b-$q-kv$kv.json" 2>&1 | tee -a "$OUT/memory.log" | grep -E "^\| qwen"
    done
    rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
done
"$Q" memory-table --json "$(ls "$OUT"/batch-7b-*.json | paste -sd,)" --by batch | tee "$OUT/memory-table-batch.md"
"$Q" memory-table --json "$(ls "$OUT"/length-7b-*.json | paste -sd,)" --by input_len | tee "$OUT/memory-table-length.md"
