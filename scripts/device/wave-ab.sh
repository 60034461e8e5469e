# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The row GEMV (gate_up of 7B, lm_head) as one wave of resident blocks striding over the rows (QINFER_GEMV_WAVE=1)
# (the default) against one block per row group (=0), with programmatic dependent launch off and on for 7B: kernel
# timings under both grids, then decode, alternated.
for w in 0 1; do
    QINFER_GEMV_WAVE=$w build-device/tests/qinfer_tests --gtest_filter='CudaOps.GemvTimings' 2>&1 | grep -E "^\[ kernel \]" |
        sed "s/^/wave=$w /" | tee -a "$OUT/wave-kernels.log"
done
for spec in ${WAVE_AB_SPECS:-qwen2.5-7b:0 qwen2.5-7b:1 qwen2.5-1.5b:1 qwen2.5-0.5b:1}; do
    p=${spec%%:*} pdl=${spec##*:}
    for w in 0 1 0 1; do
        QINFER_PDL=$pdl QINFER_GEMV_WAVE=$w "$Q" bench --preset $p --input-lens 1 --gen 512 --json "$OUT/wave-ab-$p-pdl$pdl-$w.json" 2>&1 |
            grep -E "^\| qwen" | sed "s/^/pdl=$pdl wave=$w /" | tee -a "$OUT/wave-ab.log"
    done
done
