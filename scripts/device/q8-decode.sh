# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Issue 6's cache comparison: Qwen2.5-7B with YaRN at 129024 tokens, 2048 generated, each weight format of Q8_WEIGHTS
# with each cache of Q8_KV (bf16 first: decode tokens/s of int8 against it), one JSON each. The int8 and fp8 caches
# take the raw-code tensor-copy kernel (attention_decode_q8.cu) where it applies; QINFER_DECODE_TMA=0 would keep the
# cp.async kernel with its dequantization pass.
for q in ${Q8_WEIGHTS:-gptq-int4 bf16}; do
    for kv in ${Q8_KV:-bf16 int8 fp8}; do
        "$Q" bench --preset qwen2.5-7b-yarn --quant $q --kv-dtype $kv --input-lens 129024 --gen "${AB_GEN:-2048}" \
            --json "$OUT/q8-$q-$kv.json" 2>&1 | grep -E "^\| qwen" | tee -a "$OUT/q8-decode.log"
    done
done
