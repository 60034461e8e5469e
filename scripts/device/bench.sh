# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
for p in qwen2.5-0.5b qwen2.5-7b; do
    QINFER_PROFILE=1 "$Q" bench --preset "$p" --input-lens 1,6144 --gen 256 --json "$OUT/quick-$p.json" 2>&1 | tee -a "$OUT/bench.log" | grep -v "^bench:" | tail -24
done
