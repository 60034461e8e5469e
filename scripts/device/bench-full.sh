# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# The seed table for BF16 (issue 4): qinfer at the seeds' input lengths with 2048 generated, and transformers on the
# same weights and card (input 1, 256 generated: its eager mode runs at ~15 tokens/s) for the ratios. HF_MODES: the
# transformers modes to run (default "compiled eager"); FULL_PRESETS: the models (default 0.5B, 1.5B, 7B).
for p in ${FULL_PRESETS:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b}; do
    d=/tmp/synth-$p
    "$Q" synth --preset "$p" --out "$d" >/dev/null
    for m in ${HF_MODES:-compiled eager}; do  # one process per mode: a crash in one leaves the other
        python3 scripts/hf_bench.py "$d" --model "$p" --input-lens 1 --gen 256 --modes $m --out "$OUT/hf-$m-$p.json" 2>&1 | grep '^{' || echo "hf $m: failed"
    done
    "$Q" bench --model "$d" --name "$p" --json "$OUT/bench-$p.json" --csv "$OUT/bench-$p.csv" \
        --baseline "$(ls "$OUT"/hf-*-$p.json 2>/dev/null | paste -sd,)" \
        2>&1 | tee -a "$OUT/bench.log" | grep -v "^bench:"
    rm -rf "$d"
done
