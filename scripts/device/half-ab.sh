# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Half-warp rows in the BF16 row GEMV (rows of at most 1024 values: 0.5B's lm_head) against whole warps
# (QINFER_GEMV_HALF=0): the GEMV and golden tests, the lm_head kernel timings, then rows with each setting,
# alternated HALF_REPS times (default 2): HALF_SPECS, preset:quant (input 1; 1.5B is a control, its rows are longer).
build-device/tests/qinfer_tests --gtest_filter='*Gemv*:*GoldenCuda*:-*Timings*' >"$OUT/half-tests.log" 2>&1
note "GEMV/golden tests, half rows on: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/half-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/half-tests.log" | head -20
build-device/tests/qinfer_tests --gtest_filter='CudaOps.GemvLmHeadTimings' 2>&1 | grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/half-ab.log"
for rep in $(seq "${HALF_REPS:-2}"); do
    for spec in ${HALF_SPECS:-qwen2.5-0.5b:bf16 qwen2.5-0.5b:gptq-int4 qwen2.5-1.5b:bf16}; do
        IFS=: read -r p q <<<"$spec"
        for h in 0 1; do
            QINFER_GEMV_HALF=$h "$Q" bench --preset "$p" --quant "$q" --input-lens 1 --gen "${AB_GEN:-2048}" \
                --json "$OUT/half-$p-$q-$h-$rep.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/half $h /" | tee -a "$OUT/half-ab.log"
        done
    done
done
