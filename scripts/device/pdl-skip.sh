# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Which early launch costs under PDL (QINFER_PDL_SKIP: the decode attention / its combine launched without it):
# 0.5B with the fused QKV RoPE (lost 3.6% under PDL at 6a70101) and 7B BF16 with PDL forced on at 1 and 30720
# (-6.9% at 30720), each against the defaults, alternated.
for rep in 1 2; do
    for cfg in default none attention combine attention,combine; do
        if [ $cfg = default ]; then e=""; else e="QINFER_FUSED_ROPE=1 QINFER_PDL_SKIP=$cfg"; fi
        env $e "$Q" bench --preset qwen2.5-0.5b --input-lens 1 --gen 2048 --json "$OUT/pdl-skip-0.5b-$cfg-$rep.json" 2>&1 |
            grep -E "^\| qwen" | sed "s/^/$cfg /" | tee -a "$OUT/pdl-skip.log"
    done
done
for rep in $(seq ${PDL_SKIP_7B_REPS:-2}); do
    for cfg in default none attention attention,combine; do
        if [ $cfg = default ]; then e=""; else e="QINFER_PDL=1 QINFER_PDL_SKIP=$cfg"; fi
        env $e "$Q" bench --preset qwen2.5-7b --input-lens 1,30720 --gen 2048 --json "$OUT/pdl-skip-7b-$cfg-$rep.json" 2>&1 |
            grep -E "^\| qwen" | sed "s/^/$cfg /" | tee -a "$OUT/pdl-skip.log"
    done
done
