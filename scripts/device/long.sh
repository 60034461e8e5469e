# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Issue 6's long rows: Qwen2.5-7B with YaRN at 63488 and 129024 input tokens, BF16 and Int4 weights, and the decode
# speed of each KV dtype at 129024. LONG_ARGS: more bench options for every row (e.g. --load-format dummy).
# shellcheck disable=SC2086  # LONG_ARGS splits into words on purpose
for spec in ${LONG_SPECS:-bf16:bf16:63488,129024 gptq-int4:bf16:129024 bf16:int8:129024 bf16:fp8:129024 bf16:int4:129024}; do
    IFS=: read -r q kv lens <<<"$spec"
    "$Q" bench --preset qwen2.5-7b-yarn --quant $q --kv-dtype $kv --input-lens $lens ${LONG_ARGS:-} --json "$OUT/long-7b-$q-kv$kv.json" 2>&1 |
        tee -a "$OUT/long.log" | grep -E "^\| qwen"
done
rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
