# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Issue 37's rows: `bench --kernels` (each quantized projection kernel against bf16 on 7B and 0.5B shapes; QG_KERNEL_ARGS
# more options, QG_KERNELS=0 leaves it out), then `bench --throughput` of QG_TP_PRESET (default qwen2.5-7b) for each
# of QG_TP_QUANTS (default bf16 gptq-int4 awq gptq-int8) with --load-format dummy, QG_TP_ARGS (default vLLM's 1000
# prompts of input 100, output 250). Tables to $OUT/qgemm.log, JSON per run.
if [ "${QG_KERNELS:-1}" != 0 ]; then
    # shellcheck disable=SC2086  # QG_KERNEL_ARGS splits into words on purpose
    "$Q" bench --kernels ${QG_KERNEL_ARGS:-} --json "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.md" | grep -E "^\| (7b|0.5b) .* (1|16|64|128|256) \||^card|error"
fi
for q in ${QG_TP_QUANTS-bf16 gptq-int4 awq gptq-int8}; do
    # shellcheck disable=SC2086
    "$Q" bench --throughput --preset "${QG_TP_PRESET:-qwen2.5-7b}" --quant "$q" --load-format dummy \
        ${QG_TP_ARGS:---num-prompts 1000 --input-len 100 --output-len 250} --json "$OUT/tp-$q.json" 2>&1 |
        grep -E "^Throughput|^\| qwen|error|^card" | sed "s/^/$q: /" | tee -a "$OUT/qgemm.log"
done
