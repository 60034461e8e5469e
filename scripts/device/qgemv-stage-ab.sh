# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The ring GEMV's prologue: group parameters read 8 at a time (QINFER_QGEMV_VEC_PARAMS) and bf16 inputs staged in
# shared memory by 16-byte copies (QINFER_QGEMV_STAGE_X) against the scalar parameter loop and inputs read from
# global memory in the loop. The quantized GEMV / golden tests with the new defaults and with both off, the 7B-shape
# kernels under old / params / both, then quantized rows (2048 generated) under the three, alternated QSTAGE_REPS
# times (default 2). QSTAGE_PARTS (default "tests kernels rows") picks the parts; QSTAGE_ROW_CONFIGS (default
# "old params both") the configurations of the rows; "default" is the shipped rule (staged from k 8192),
# "k3584" stages from k 3584 (7B's o_proj and 0.5B's down too).
parts=" ${QSTAGE_PARTS:-tests kernels rows} "
configs=("old QINFER_QGEMV_STAGE_X=0 QINFER_QGEMV_VEC_PARAMS=0" "params QINFER_QGEMV_STAGE_X=0" "both QINFER_QGEMV_STAGE_X=1"
    "default QINFER_QGEMV_STAGE_X=" "k3584 QINFER_QGEMV_STAGE_MIN_K=3584")
for c in "${configs[0]}" "${configs[2]}"; do
    [[ $parts == *" tests "* ]] || break
    read -r tag envs <<<"$c"
    env $envs build-device/tests/qinfer_tests --gtest_filter='*Quant*:*GoldenCuda*:-*Timings*' >"$OUT/qstage-tests-$tag.log" 2>&1
    note "quantized / golden tests ($tag): $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/qstage-tests-$tag.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/qstage-tests-$tag.log" | head -20
done
for c in "${configs[@]}"; do
    [[ $parts == *" kernels "* ]] || break
    read -r tag envs <<<"$c"
    env $envs build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 |
        grep -E "^\[ kernel \] qgemv .*m 1 " | sed "s/^/$tag /" | tee -a "$OUT/qstage-kernels.log"
done
if [[ $parts == *" rows "* ]]; then
    ab_configs qstage "${QSTAGE_REPS:-2}" \
        "${QSTAGE_SPECS:-qwen2.5-7b:gptq-int4:1,30720 qwen2.5-7b:gptq-int8:1 qwen2.5-7b:awq:1 qwen2.5-0.5b:gptq-int4:1}" \
        "${QSTAGE_ROW_CONFIGS:-old params both}" "${configs[@]}"
fi
