# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Kernel timings of every tiled format on 7B shapes, the quantized GEMV tests, and per-instruction stall samples of
# the 8-bit and lookup gate_up kernels (reports stay on the device; the per-instruction CSVs come back gzipped).
build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 | grep -E "^\[ kernel \]|FAILED" |
    tee "$OUT/tile-kernels.log"
build-device/tests/qinfer_tests --gtest_filter='*QuantGemv*:CudaQuant.Dequantize*' >"$OUT/tile-test.log" 2>&1
note "quant GEMV tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/tile-test.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/tile-test.log" | head -20
if command -v ncu >/dev/null; then
    for codes in 1 2; do
        timeout 150 ncu --clock-control none --kernel-name-base mangled -k "regex:qgemv_ring_kernelILNS1_5CodesE${codes}ELNS0_7GemvOutE3" \
            --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters \
            -f -o /tmp/ring-codes$codes build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' >/dev/null 2>&1
        ncu -i /tmp/ring-codes$codes.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$OUT/ring-codes$codes-sass.csv.gz"
        ncu -i /tmp/ring-codes$codes.ncu-rep --page details >"$OUT/ring-codes$codes-details.txt" 2>&1
        grep -E "Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Block Limit" \
            "$OUT/ring-codes$codes-details.txt" | head -12
    done
fi
