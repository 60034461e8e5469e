# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Why the fused QKV RoPE slowed 0.5B (head_dim 64): fused x PDL alternated on 0.5B, eager per-op profiles of both,
# and PDL on 7B BF16 (off by default over 8 GB) at 1 and 30720 now that its decode attention takes 104 KB per block.
for rep in 1 2; do
    for cfg in 0:0 1:0 0:1 1:1; do
        QINFER_FUSED_ROPE=${cfg%%:*} QINFER_PDL=${cfg##*:} "$Q" bench --preset qwen2.5-0.5b --input-lens 1 --gen 2048 \
            --json "$OUT/rope-pdl-0.5b-${cfg/:/-}-$rep.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/fused:pdl $cfg /" | tee -a "$OUT/rope-pdl.log"
    done
done
for fr in 0 1; do
    QINFER_FUSED_ROPE=$fr QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-0.5b --input-lens 1 --gen 64 2>&1 |
        grep -E "^  |profile" | sed "s/^/fused $fr /" | tee -a "$OUT/rope-pdl-profile.log"
done
for rep in 1 2; do
    for pdl in 0 1; do
        QINFER_PDL=$pdl "$Q" bench --preset qwen2.5-7b --input-lens 1,30720 --gen 2048 \
            --json "$OUT/rope-pdl-7b-$pdl-$rep.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/pdl $pdl /" | tee -a "$OUT/rope-pdl.log"
    done
done
