# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Which decode-attention launches should go without programmatic dependent launch, per model: every model with PDL
# on, the split kernel and/or its combine launched normally (QINFER_PDL_SKIP), each model's current default first.
for spec in ${PDL_MATRIX_SPECS:-qwen2.5-0.5b:bf16:1,30720 qwen2.5-1.5b:bf16:1,30720 qwen2.5-7b:bf16:1,6144,30720 qwen2.5-7b:gptq-int4:1,30720}; do
    IFS=: read -r p q lens <<<"$spec"
    for cfg in default none combine attention,combine; do
        if [ $cfg = default ]; then e=""; else e="QINFER_PDL=1 QINFER_PDL_SKIP=$cfg"; fi
        env $e "$Q" bench --preset $p --quant $q --input-lens $lens --gen 2048 --json "$OUT/pdl-matrix-$p-$q-$cfg.json" 2>&1 |
            grep -E "^\| qwen" | sed "s/^/$cfg /" | tee -a "$OUT/pdl-matrix.log"
    done
    rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
done
