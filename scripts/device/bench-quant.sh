# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# The quantized rows (issue 5): each format against BF16 of the same shapes on the same card, in one run.
for spec in qwen2.5-7b:bf16 qwen2.5-7b:gptq-int4 qwen2.5-7b:awq qwen2.5-7b:gptq-int8 qwen2.5-7b:nf4 qwen2.5-0.5b:bf16 qwen2.5-0.5b:gptq-int4; do
    p=${spec%%:*} q=${spec##*:}
    lens=1,30720
    [ "$q" = nf4 ] && lens=1
    "$Q" bench --preset "$p" --quant "$q" --input-lens $lens --json "$OUT/bench-$p-$q.json" --csv "$OUT/bench-$p-$q.csv" \
        2>&1 | tee -a "$OUT/bench.log" | grep -v "^bench:"
    rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
done
