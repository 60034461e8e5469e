# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The decode combine launched early under PDL where the sequences stay within cuda::k_short_decode_keys keys (default,
# QINFER_PDL_SKIP=combine-long) against never (QINFER_PDL_SKIP=combine, the old default): the attention, golden and
# batch GPU tests, then rows alternated AB_REPS times (default 2) for COMBINE_PDL_SPECS.
build-device/tests/qinfer_tests --gtest_filter='*Attention*:*GoldenCuda*:*Batch*-*LongContext*:*Timings*' >"$OUT/combine-pdl-tests.log" 2>&1
note "attention / golden / batch tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/combine-pdl-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/combine-pdl-tests.log" | head -20
ab QINFER_PDL_SKIP "combine-long combine" \
    "${COMBINE_PDL_SPECS:-qwen2.5-0.5b:bf16:1 qwen2.5-1.5b:bf16:1 qwen2.5-0.5b:gptq-int4:1 qwen2.5-7b:bf16:1,6144}" combine-pdl
