# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Prefill dequantization: the quantized tests and goldens, the prefill GEMM timings per format; then programmatic
# dependent launch on 7B BF16 (off by default above 8 GB of checkpoint), alternated.
build-device/tests/qinfer_tests --gtest_filter='*Quant*:*Dequant*:*GoldenCuda*' >"$OUT/dequant-test.log" 2>&1
note "quant tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/dequant-test.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/dequant-test.log" | head -30
grep -E "^\[ kernel \] prefill" "$OUT/dequant-test.log"
for rep in 1 2; do
    for pdl in 0 1; do
        QINFER_PDL=$pdl "$Q" bench --preset qwen2.5-7b --input-lens 1 --gen 512 --json "$OUT/pdl-7b-$pdl-$rep.json" 2>&1 |
            grep -E "^\| qwen" | sed "s/^/pdl=$pdl /" | tee -a "$OUT/pdl-ab.log"
    done
done
