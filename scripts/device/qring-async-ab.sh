# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The ring GEMV's codes in flight in shared memory (cp.async into each thread's own slots: 12 per lane, 14 for the
# deep ring, no registers) against the register ring (QINFER_QRING_ASYNC=0: 6, deep 12): the quantized / golden tests
# under both, the 7B-shape decode GEMV timings under both (alternated twice), then quantized rows (2048 generated)
# alternated QASYNC_REPS times (default 2). QASYNC_PARTS (default "tests kernels rows") picks the parts, QASYNC_SPECS
# the rows (preset:quant:lengths).
parts=" ${QASYNC_PARTS:-tests kernels rows} "
configs=("regs QINFER_QRING_ASYNC=0" "async QINFER_QRING_ASYNC=")
for c in "${configs[@]}"; do
    [[ $parts == *" tests "* ]] || break
    read -r tag envs <<<"$c"
    env $envs build-device/tests/qinfer_tests --gtest_filter='*Quant*:*GoldenCuda*:-*Timings*' >"$OUT/qasync-tests-$tag.log" 2>&1
    note "quantized / golden tests ($tag): $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/qasync-tests-$tag.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/qasync-tests-$tag.log" | head -20
done
for rep in 1 2; do
    for c in "${configs[@]}"; do
        [[ $parts == *" kernels "* ]] || break 2
        read -r tag envs <<<"$c"
        env $envs build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 |
            grep -E "^\[ kernel \] qgemv " | sed "s/^/$tag /" | tee -a "$OUT/qasync-kernels.log"
    done
done
if [[ $parts == *" rows "* ]]; then
    ab_configs qasync "${QASYNC_REPS:-2}" "${QASYNC_SPECS:-qwen2.5-7b:gptq-int4:1 qwen2.5-0.5b:gptq-int4:1}" "regs async" "${configs[@]}"
fi
