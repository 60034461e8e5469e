# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Quantized decode, short: BF16 and each 4/8-bit format of one model in the same run.
for q in ${QUICK_QUANTS:-bf16 gptq-int4 awq gptq-int8 nf4}; do
    QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-7b --quant $q --input-lens 1 --gen 256 --json "$OUT/quick-7b-$q.json" 2>&1 |
        tee -a "$OUT/bench.log" | grep -v "^bench:" | tail -20
done
