# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The same for the small BF16 models at 30720 (their activations per token are a quarter / half of 7B's).
for spec in qwen2.5-0.5b:1024 qwen2.5-0.5b:4096 qwen2.5-1.5b:1024 qwen2.5-1.5b:2048 qwen2.5-0.5b:1024 qwen2.5-0.5b:4096 qwen2.5-1.5b:1024 qwen2.5-1.5b:2048; do
    p=${spec%%:*} c=${spec##*:}
    QINFER_PREFILL_CHUNK=$c "$Q" bench --preset $p --input-lens 30720 --gen 2048 --json "$OUT/chunk-$p-$c.json" 2>&1 |
        grep -E "^\| qwen" | sed "s/^/chunk=$c /" | tee -a "$OUT/chunk-small.log"
done
