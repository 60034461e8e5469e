# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Decode attention on 7B's shapes (CudaDecodeTimings, caches of several layers in turn) for each blocks-per-SM
# setting in DECODE_BPS, then ncu of one 30720-key step (the split kernel and its combine; the 2048-key case runs
# first: 48 layers x 22 calls of each kernel are skipped).
for bps in ${DECODE_BPS:-3 2 4 3}; do
    echo "-- blocks per SM $bps" | tee -a "$OUT/decode-attn.log"
    QINFER_DECODE_BLOCKS_PER_SM=$bps build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.*' 2>&1 |
        grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/decode-attn.log"
done
if command -v ncu >/dev/null; then
    timeout 200 ncu --clock-control none -k "regex:attention_(decode_tc|combine)" --launch-skip 2112 --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
        build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.*' >"$OUT/decode-attn-ncu.txt" 2>&1
    grep -E "attention_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" \
        "$OUT/decode-attn-ncu.txt" | head -40
fi
