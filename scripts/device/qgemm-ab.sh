# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The fused prefill GEMM (qgemm_wgmma.cu: dequantization into shared memory, wgmma) against dequantize + cuBLASLt: the
# quantized and golden tests, the prefill GEMM timings of the 7B shapes at m 1024 (bf16 cuBLASLt on the same
# weights in the same process) and the fused kernel against dequantize + cuBLASLt across m, then quantized rows under
# QGEMM_CONFIGS (default "off all": QINFER_QGEMM=0, fused at every m; "m512": fused up to m 512; both only where
# qgemm_pays takes the weight: one 128-row tile per SM, or K splits of 16 K blocks at m <= 128) alternated
# QGEMM_REPS times (default 2). QGEMM_PARTS (default "tests kernels rows") picks the parts, QGEMM_SPECS the rows
# (preset:quant:lengths).
parts=" ${QGEMM_PARTS:-tests kernels rows} "
if [[ $parts == *" tests "* ]]; then
    build-device/tests/qinfer_tests --gtest_filter='*Quant*:*GoldenCuda*:-*Timings*' >"$OUT/qgemm-tests.log" 2>&1
    note "quantized / golden tests: $(grep -E '^\[  PASSED  \]|FAILED TEST|SKIPPED \]' "$OUT/qgemm-tests.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/qgemm-tests.log" | head -40
fi
if [[ $parts == *" kernels "* ]]; then
    build-device/tests/qinfer_tests --gtest_filter='CudaQuant.PrefillGemmTimings:CudaQuant.FusedGemmByMTimings' 2>&1 |
        grep -E "^\[ kernel \] (prefill|fused)" | tee "$OUT/qgemm-kernels.log"
fi
configs=("off QINFER_QGEMM=0" "all QINFER_QGEMM_MAX_M=1000000" "m512 QINFER_QGEMM_MAX_M=512")
if [[ $parts == *" rows "* ]]; then
    ab_configs qgemm "${QGEMM_REPS:-2}" "${QGEMM_SPECS:-qwen2.5-7b:gptq-int4:30720 qwen2.5-7b:awq:30720 qwen2.5-7b:gptq-int8:30720}" \
        "${QGEMM_CONFIGS:-off all}" "${configs[@]}"
fi
