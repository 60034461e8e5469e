# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The decode attention's combine in one pass (each split lane rescales as it goes; default) against two (the maximum
# over all splits first, QINFER_COMBINE_PASSES=2): per-layer timings on 7B's and 0.5B's shapes under both,
# alternated twice, then rows alternated COMBINE_REPS times (default 2) for COMBINE_SPECS (preset:quant:lengths).
# The one-pass kernel's tests are the gpu-test stage's (the two-pass one is the kernel tested before it).
configs=("one QINFER_COMBINE_PASSES=1" "two QINFER_COMBINE_PASSES=2")
for rep in 1 2; do
    for c in "${configs[@]}"; do
        read -r tag envs <<<"$c"
        env $envs build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BShapes:CudaDecodeTimings.Qwen05BShapes' 2>&1 |
            grep -E "^\[ kernel \].*tensor copies" | sed "s/^/$tag /" | tee -a "$OUT/combine-kernels.log"
    done
done
ab_configs combine "${COMBINE_REPS:-2}" "${COMBINE_SPECS:-qwen2.5-0.5b:bf16:1 qwen2.5-1.5b:bf16:1}" "one two" "${configs[@]}"
