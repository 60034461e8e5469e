# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# The rows of this commit with 2048 generated (BF16 and 4-bit, short and long), one JSON each. ROW_SPECS: entries
# preset:quant:input lengths; ROW_ARGS: more bench options for every row (e.g. --load-format dummy).
# shellcheck disable=SC2086  # ROW_ARGS splits into words on purpose
for spec in ${ROW_SPECS:-qwen2.5-0.5b:bf16:1,30720 qwen2.5-1.5b:bf16:1 qwen2.5-7b:bf16:1,30720 qwen2.5-0.5b:gptq-int4:1 qwen2.5-7b:gptq-int4:1,30720 qwen2.5-7b:awq:1}; do
    IFS=: read -r p q lens <<<"$spec"
    "$Q" bench --preset $p --quant $q --input-lens $lens --gen 2048 ${ROW_ARGS:-} --json "$OUT/row-$p-$q.json" 2>&1 | grep -E "^\| qwen" |
        tee -a "$OUT/rows.log"
done
