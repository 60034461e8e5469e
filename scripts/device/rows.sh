# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# The rows of this commit with 2048 generated (BF16 and 4-bit, short and long), one JSON each. ROW_SPECS: entries
# preset:quant:input lengths; ROW_ARGS: more bench options for every row (e.g. --load-format dummy). ROW_CLOCKS=1: sample
# nvidia-smi's clocks, power, temperatures and slowdown reasons every 200 ms during each row (clocks-<row>.csv), summed
# up by scripts/clocks_summary.py.
# shellcheck disable=SC2086  # ROW_ARGS splits into words on purpose
for spec in ${ROW_SPECS:-qwen2.5-0.5b:bf16:1,30720 qwen2.5-1.5b:bf16:1 qwen2.5-7b:bf16:1,30720 qwen2.5-0.5b:gptq-int4:1 qwen2.5-7b:gptq-int4:1,30720 qwen2.5-7b:awq:1}; do
    IFS=: read -r p q lens <<<"$spec"
    sampler=
    if [ "${ROW_CLOCKS:-0}" = 1 ]; then
        fields=timestamp,utilization.gpu,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,temperature.memory,clocks_event_reasons.active
        # drivers before the 'event reasons' name know the field as clocks_throttle_reasons
        nvidia-smi --query-gpu="$fields" --format=csv >/dev/null 2>&1 || fields=${fields/clocks_event_reasons/clocks_throttle_reasons}
        nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits -lms 200 >"$OUT/clocks-$p-$q.csv" 2>&1 &
        sampler=$!
    fi
    "$Q" bench --preset $p --quant $q --input-lens $lens --gen 2048 ${ROW_ARGS:-} --json "$OUT/row-$p-$q.json" 2>&1 | grep -E "^\| qwen" |
        tee -a "$OUT/rows.log"
    if [ -n "$sampler" ]; then
        kill "$sampler" 2>/dev/null
        wait "$sampler" 2>/dev/null
        python3 scripts/clocks_summary.py "$OUT/clocks-$p-$q.csv" "$p $q" | tee -a "$OUT/rows.log"
    fi
done
